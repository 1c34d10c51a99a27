"""What operators read in the deployed stacks (dashboard text and titles, alarm descriptions) speaks of
the system, never of how it was planned or built: no planning words, in every shipped stage."""

import json
import re

import pytest

from prefix_routing.stage.config import CONFIG_DIR, DEFAULT_STAGE, load_stage
from tests.stacks.conftest import synth

STAGES = [DEFAULT_STAGE, *sorted(path.stem for path in CONFIG_DIR.glob("*.toml"))]
# Words that belong to a plan, a work log or a build machine, not to an operator's view of the system.
PLANNING_WORDS = re.compile(
    r"\bbrief('s)?\b|\bissues? #?\d+|\bsessions?\b|\bthis machine\b|\bmoot\b|\bthe split\b|\.\./shared|"
    r"fleet-presets|\bTODO\b|\bFIXME\b|\bXXX\b|\bthe task\b|\bas asked\b|\bwe agreed\b|\breviewers?\b",
    re.IGNORECASE,
)


def _strings(value):
    """Every string inside a template value (intrinsic functions included)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def user_texts(template: dict) -> dict[str, str]:
    """{resource: text} of every dashboard body and alarm description in a template."""
    texts = {}
    for logical_id, resource in template.get("Resources", {}).items():
        props = resource.get("Properties", {})
        for key in ("DashboardBody", "AlarmDescription"):
            if key in props:
                texts[f"{logical_id}.{key}"] = "".join(_strings(props[key]))
    return texts


@pytest.fixture(scope="module", params=STAGES)
def stage_templates(request, default_templates):
    if request.param == DEFAULT_STAGE:
        return default_templates
    return synth(load_stage(request.param))[1]


def test_dashboards_and_alarm_descriptions_use_no_planning_words(stage_templates):
    texts = {f"{name}:{where}": text for name, template in stage_templates.items()
             for where, text in user_texts(template.to_json()).items()}
    assert any(".DashboardBody" in where for where in texts) and any(".AlarmDescription" in where for where in texts)
    found = {where: sorted({m.group(0) for m in PLANNING_WORDS.finditer(text)})
             for where, text in texts.items() if PLANNING_WORDS.search(text)}
    assert not found, found


@pytest.mark.parametrize("text", [
    "the brief's 50 % line", "see issue 3", "measured in this session", "on this machine", "../shared/reference",
])
def test_the_check_catches_planning_words(text):
    assert PLANNING_WORDS.search(text)
