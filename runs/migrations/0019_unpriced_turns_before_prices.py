"""Turns recorded before prices existed (migration 0018) had no price: a run
that spent tokens then has unpriced turns, its cost unknown (G17), not 0."""

from django.db import migrations
from django.db.models import Count, IntegerField, OuterRef, Subquery


def count_turns_recorded_before_prices(apps, schema_editor):
    AgentRun = apps.get_model("runs", "AgentRun")
    RunStep = apps.get_model("runs", "RunStep")
    turns = (
        RunStep.objects.filter(run=OuterRef("pk"), kind="llm", result__has_key="usage")
        .order_by()
        .values("run")
        .annotate(turns=Count("pk"))
        .values("turns")
    )
    spent = AgentRun.objects.filter(prompt_tokens__gt=0) | AgentRun.objects.filter(
        completion_tokens__gt=0
    )
    spent.update(unpriced_turns=Subquery(turns, output_field=IntegerField()))


class Migration(migrations.Migration):
    dependencies = [("runs", "0018_spend_totals")]

    operations = [
        migrations.RunPython(count_turns_recorded_before_prices, migrations.RunPython.noop),
    ]
