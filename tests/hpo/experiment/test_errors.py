"""How a bad experiment is reported (:mod:`hpo.experiment._errors`): one line naming the file, or the ``--override``
that set the field, the field and the message; an override's text shown cut when long and never with a secret."""

from __future__ import annotations

from hpo.experiment._errors import MAX_SHOWN_OVERRIDE, ErrorContext, SpaceError, shown_override


def test_a_field_of_the_file_is_named_with_the_file() -> None:
    ctx = ErrorContext("exp.yaml", {})
    err = ctx.error("study.n_trials", "must be positive, got 0")
    assert isinstance(err, SpaceError) and isinstance(err, ValueError)
    assert str(err) == "exp.yaml: study.n_trials: must be positive, got 0"
    assert str(ctx.error("", "top level must be a mapping")) == "exp.yaml: top level must be a mapping"


def test_a_field_an_override_set_names_the_override_whatever_level_the_error_is_at() -> None:
    ctx = ErrorContext("exp.yaml", {"params.x.high": "params.x.high=2", "study": "study={}"})
    assert str(ctx.error("params.x.high", "bad")) == "--override 'params.x.high=2': params.x.high: bad"
    assert str(ctx.error("params.x", "low=3 is greater than high=2")).startswith("--override 'params.x.high=2': ")
    assert str(ctx.error("study.n_trials", "bad")).startswith("--override 'study={}': ")  # set by the override above
    assert str(ctx.error("params.xy", "bad")) == "exp.yaml: params.xy: bad"  # a prefix of a name is not its field
    assert str(ctx.error("params.y.high", "bad")) == "exp.yaml: params.y.high: bad"


def test_an_override_s_text_is_cut_when_long_and_a_secret_s_value_never_shown() -> None:
    short = "trainer.x=1"
    assert shown_override(short) == short
    long = "trainer.path=" + "é" * 100
    shown = shown_override(long)
    assert shown == f"{long[:MAX_SHOWN_OVERRIDE]}... ({len(long.encode())} bytes)" and len(shown) < len(long)
    assert shown_override("trainer.hub_token=hf_abcdef") == "trainer.hub_token=<a secret, not shown>"
    assert shown_override(" HF_TOKEN =x") == " HF_TOKEN =<a secret, not shown>"
    assert shown_override("no equals sign at all") == "no equals sign at all"
    ctx = ErrorContext("exp.yaml", {"overrides.hub_token": "hub_token=hf_abcdef"})
    assert "hf_abcdef" not in str(ctx.error("overrides.hub_token", "bad"))
