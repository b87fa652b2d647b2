"""The overview counts the dead letters of the last 24 hours, open or
resolved: an index on when they were made (200k of them took 60 ms)."""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0023_last_passes'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddIndex(
            model_name='deadletter',
            index=models.Index(fields=['-created_at'], name='dead_letter_created_idx'),
        ),
    ]
