"""The trainer's configuration is declared once (``fastgp.train.config``): each field's flag,
help, parser and choices come from its declaration, and the command, its errors and the run's
resolution read them from there. A new field is its declaration and a line here."""

import dataclasses

import pytest

from fastgp.train.cli.parser import build_parser, flagged_fields, overrides
from fastgp.train.config import FLAGS, Flag, TrainConfig, flag_of

# The fields a recipe sets but no flag does.
RECIPE_ONLY = {"gp_target", "betas", "latent_dim"}
# A value each flag parses, as text, and what it parses to (the switch takes none).
SAMPLES = {"int": ("3", 3), "float": ("0.5", 0.5)}


def _flag(field) -> Flag:
    flag = flag_of(field)
    assert flag is not None
    return flag


def _sample(field):
    flag = _flag(field)
    if flag.switch:
        return [flag.name], True
    if flag.choices is not None:
        choice = flag.choices[-1]
        return [flag.name, str(choice)], choice
    text, value = SAMPLES["float" if isinstance(field.default, float) else "int"]
    if field.name == "gp_weight_final":
        text, value = SAMPLES["float"]
    return [flag.name, text], value


def test_every_field_has_a_flag_or_is_declared_recipe_only():
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert {f.name for f in flagged_fields()} == fields - RECIPE_ONLY
    assert set(FLAGS) == fields - RECIPE_ONLY


@pytest.mark.parametrize("field", flagged_fields(), ids=lambda f: f.name)
def test_each_flag_sets_its_field_as_declared(field):
    argv, value = _sample(field)
    args = build_parser().parse_args(["train", *argv])
    shared = [f.name for f in flagged_fields() if _flag(f).name == _flag(field).name]
    assert overrides(args) == dict.fromkeys(shared, value)


def test_train_help_is_each_declared_help_with_the_recipes_default(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "10000")  # one line per option
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for field in flagged_fields():
        flag = _flag(field)
        assert " ".join(flag.help.split()) in text, flag.name
        shown = f"{flag.help} (default: "
        assert (" ".join(shown.split()) in text) == flag.recipe_default, flag.name


def test_a_value_the_declared_parser_refuses_names_its_flag(capsys):
    for field in flagged_fields():
        flag = _flag(field)
        if flag.switch:
            continue
        with pytest.raises(SystemExit):
            build_parser().parse_args(["train", flag.name, "nonsense"])
        assert f"argument {flag.name}" in capsys.readouterr().err, flag.name
