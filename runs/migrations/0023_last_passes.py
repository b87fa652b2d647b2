"""The periodic processes' last passes (runs/liveness.py): the console shows
whether the reaper, or the embedded worker, is alive."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0022_reconciliations_outlive_their_run'),
    ]

    operations = [
        migrations.CreateModel(
            name='LastPass',
            fields=[
                ('name', models.CharField(max_length=32, primary_key=True, serialize=False)),
                ('at', models.DateTimeField()),
                ('process', models.CharField(max_length=255)),
                ('every_seconds', models.FloatField()),
            ],
            options={
                'ordering': ['name'],
            },
        ),
    ]
