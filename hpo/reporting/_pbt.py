"""``best`` of a population-based training study (``study.strategy: pbt``): the winning lineage, its
hyperparameter schedule (values by step range), final value and checkpoint, as a table or exported as JSON
(``--format schedule``); and the lineage rows the dashboard draws."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from hpo.experiment._space import Space, format_value
from hpo.study._population import best_final, lineage_of, pbt_total


def best_lineage(space: Space, study: optuna.Study, number: int | None = None) -> dict[str, Any] | None:
    """The winning member's lineage (or the one ending in trial ``number``): trials, schedule, value, checkpoint.
    None when no segment has a value yet."""
    from hpo.study._confirm import confirmed

    trials = study.get_trials(deepcopy=False)
    ranked = confirmed(study) if number is None else []
    if ranked:  # confirmed schedules: the best confirmed mean, as for fixed configs
        final: FrozenTrial | None = ranked[0].trial
    elif number is None:
        final = best_final(study, pbt_total(space))
    else:
        final = next((t for t in trials if t.number == number), None)
    if final is None or not final.values:
        return None
    chain = lineage_of(trials, final.number)
    by_number = {t.number: t for t in trials}
    steps: list[dict[str, Any]] = []
    for seg in chain:
        ps = {p.key: seg.params[p.name] for p in space.params if p.name in seg.params}
        if steps and steps[-1]["params"] == seg.params and steps[-1]["end"] == seg.start:
            steps[-1]["end"] = seg.end
            steps[-1]["trials"].append(seg.number)
            continue
        steps.append({"start": seg.start, "end": seg.end, "params": dict(seg.params), "trials": [seg.number],
                      "overrides": [f"{k}={format_value(v)}" for k, v in ps.items()]})
    end = int(final.system_attrs.get("pbt:end", 0))
    trial_dir = final.user_attrs.get("trial_dir")
    ckpt = str(Path(trial_dir) / "checkpoints" / f"global_step_{end}") if trial_dir else None
    return {"study": study.study_name, "trial": final.number, "member": final.system_attrs.get("pbt:member"),
            "value": final.values[0], "end": end, "checkpoint": ckpt,
            "lineage": [{"trial": s.number, "member": s.member, "action": s.action, "start": s.start, "end": s.end,
                         "value": by_number[s.number].values[0] if by_number[s.number].values else None}
                        for s in chain],
            "schedule": steps,
            "confirmed": None if not ranked else {"mean": ranked[0].mean, "std": ranked[0].std, "n": ranked[0].n,
                                                  "values": list(ranked[0].values), "seeds": list(ranked[0].seeds)}}


def render_pbt_best(space: Space, found: dict[str, Any], fmt: str) -> tuple[str, str]:
    """(header for stderr, output for stdout). ``schedule``: the JSON of :func:`best_lineage`; ``overrides`` /
    ``yaml`` / ``command``: the values in force at the end, the schedule in the header."""
    lines = [f"# trial {found['trial']} of study {found['study']} (member {found['member']}, step {found['end']}): "
             f"{space.objective.label} {found['value']:.4g}; checkpoint {found['checkpoint']}",
             "# lineage: " + " -> ".join(f"{x['trial']}({x['action']} m{x['member']} {x['start']}-{x['end']})"
                                         for x in found["lineage"]),
             "# schedule (values by step range):"]
    if found.get("confirmed"):
        c = found["confirmed"]
        lines.insert(1, f"# confirmed mean {c['mean']:.4g} +- {c['std']:.3g} over {c['n']} fresh seed(s) "
                        f"(schedule re-run from scratch; min {min(c['values']):.4g}, max {max(c['values']):.4g})")
    lines += [f"#   steps {s['start']}-{s['end']}: {shlex.join(s['overrides'])}" for s in found["schedule"]]
    header = "\n".join(lines)
    if fmt == "schedule":
        return header, json.dumps(found, indent=2)
    last = found["schedule"][-1]
    if fmt == "yaml":
        import yaml

        from hpo.reporting._report import nest

        return header, yaml.safe_dump(nest({o.partition("=")[0]: v for o, v in zip(
            last["overrides"], last["params"].values(), strict=False)}), sort_keys=False).rstrip()
    if fmt == "command":
        fixed = [f"{k}={format_value(v)}" for k, v in space.overrides.items()]
        return header, shlex.join([*space.trial.command, "--config", space.config, *fixed, *last["overrides"],
                                   "trainer.resume_mode=resume_path",
                                   f"trainer.resume_from_path={found['checkpoint']}"])
    return header, shlex.join(last["overrides"])


def lineage_rows(trials: list[FrozenTrial]) -> list[dict[str, Any]]:
    """One row per segment for the dashboard: member, step range, action, parent, donor, source, value."""
    rows = []
    for t in trials:
        s = t.system_attrs
        if "pbt:member" not in s or t.user_attrs.get("stop_reason") == "surplus":
            continue
        rows.append({"trial": t.number, "member": s["pbt:member"], "start": s["pbt:start"], "end": s["pbt:end"],
                     "action": s.get("pbt:action"), "parent": s.get("pbt:parent_trial"), "donor": s.get("pbt:donor"),
                     "source": s.get("pbt:source"), "state": t.state.name, "params": dict(t.params),
                     "value": t.values[0] if t.values else None, "stop": t.user_attrs.get("stop_reason")})
    return rows
