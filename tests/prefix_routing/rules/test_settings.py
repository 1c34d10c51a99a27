"""The normalizer's settings and freeze rules, validated when made (prefix_routing.rules.settings)."""

from __future__ import annotations

import json

import pytest

from prefix_routing.rules.errors import SettingsError
from prefix_routing.rules.settings import FreezeRule, NormalizerSettings
from tests.prefix_routing.rules.conftest import DATE


def test_settings_from_mapping():
    settings = NormalizerSettings.from_mapping({
        "prefix_length": 2048, "block_bytes": 256, "max_depth": 32, "max_body_bytes": 1000,
        "freeze_rules": [{"name": "date", "pattern": r"\d{4}-\d{2}-\d{2}"}], "freeze_placement": "first_user_message",
    })
    assert settings == NormalizerSettings(2048, 256, (DATE,), 1000, 32, "first_user_message")
    assert NormalizerSettings.from_mapping({}) == NormalizerSettings()


@pytest.mark.parametrize(
    "data, field, allowed",
    [
        ({"prefix_lenght": 2048}, "prefix_lenght", "prefix_length"),
        ({"prefix_length": 1023}, "prefix_length", "1024..65536"),
        ({"prefix_length": 65537}, "prefix_length", "1024..65536"),
        ({"prefix_length": "4096"}, "prefix_length", "an integer"),
        ({"prefix_length": True}, "prefix_length", "an integer"),
        ({"block_bytes": 63}, "block_bytes", "64.."),
        ({"max_depth": 3}, "max_depth", "8..256"),
        ({"max_body_bytes": 7 * 2**20}, "max_body_bytes", "6291456"),
        ({"freeze_placement": "end"}, "freeze_placement", "system_message"),
        ({"freeze_rules": {"name": "x"}}, "freeze_rules", "a list"),
        ({"freeze_rules": [{"name": "x"}]}, "freeze_rules[0]", '"pattern"'),
        ({"freeze_rules": [{"name": "x", "pattern": "a", "flags": 1}]}, "freeze_rules[0]", '"pattern"'),
        ({"freeze_rules": [{"name": "1x", "pattern": "a"}]}, "freeze_rules[0].name", "a letter"),
        ({"freeze_rules": [{"name": "x", "pattern": "("}]}, "freeze_rules[0].pattern", "regular expression"),
        ({"freeze_rules": [{"name": "x", "pattern": "a*"}]}, "freeze_rules[0].pattern", "non-empty"),
        ({"freeze_rules": [{"name": "x", "pattern": "a"}, {"name": "x", "pattern": "b"}]}, "freeze_rules[1].name",
         "unique"),
    ],
)
def test_settings_errors_name_source_field_and_allowed(data, field, allowed):
    with pytest.raises(SettingsError) as caught:
        NormalizerSettings.from_mapping(data, source="stage.json")
    message = str(caught.value)
    assert message.startswith(f"stage.json: {field}: ")
    assert "allowed: " in message and allowed in message.split("allowed: ", 1)[1]
    assert "\n" not in message


def test_settings_constructor_validates_too():
    with pytest.raises(SettingsError):
        NormalizerSettings(prefix_length=100)
    with pytest.raises(SettingsError):
        FreezeRule("x", "")
    assert NormalizerSettings(freeze_rules=[DATE]).freeze_rules == (DATE,)


def test_settings_load(tmp_path):
    path = tmp_path / "normalizer.json"
    path.write_text(json.dumps({"prefix_length": 8192, "freeze_rules": [{"name": "date", "pattern": r"\d{4}-\d{2}-\d{2}"}]}))
    assert NormalizerSettings.load(path) == NormalizerSettings(prefix_length=8192, freeze_rules=(DATE,))
    for content, expected in [(b"{", "not valid JSON"), (b'{"prefix_length": 2048, "prefix_length": 4096}', "duplicate"),
                              (b"\xff", "not UTF-8"), (b"[]", "not an object")]:
        path.write_bytes(content)
        with pytest.raises(SettingsError, match=expected) as caught:
            NormalizerSettings.load(path)
        assert str(caught.value).startswith(str(path))
    with pytest.raises(SettingsError, match="cannot read"):
        NormalizerSettings.load(tmp_path / "missing.json")
