"""Teams (G22): every run is its team's, the default team's for every run
from before; a team member's runs list reads run_team_created_idx. On
PostgreSQL the column is added with a constant default (a catalog change,
no table rewrite); the index is built under the migration's lock."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from runs.migrations import _team_fixed


class Migration(migrations.Migration):

    dependencies = [
        ('agents', '0002_agent_team'),
        ('runs', '0028_overview_reads_the_created_index'),
        ('teams', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='agentrun',
            name='team',
            field=models.ForeignKey(db_default=1, db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='teams.team'),
        ),
        migrations.AddIndex(
            model_name='agentrun',
            index=models.Index(fields=['team', '-created_at'], name='run_team_created_idx'),
        ),
            migrations.RunPython(_team_fixed.create_guard, _team_fixed.drop_guard),
    ]
