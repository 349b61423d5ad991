"""Fit an OOD gate for a model from simulated nominal driving (the basis of `dualloop gate fit`).

The gate library (ood/) knows only feature matrices; this module produces them: expert-driven
nominal episodes from the simulator, run through the model's forward pass exactly as the executor
does (same normalisation), giving either the decision vectors or the raw input features.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from dualloop import ood
from dualloop.controller.training.log_eval import decision_vectors
from dualloop.controller.training.recorded import read_log_rows
from dualloop.controller.training.rollouts import run_model_batch
from dualloop.executor.default_plan import DefaultPlan
from dualloop.executor.gating import GATE_SOURCES, gate_feature_names
from dualloop.executor.history import HistoryDeriver, episode_history
from dualloop.executor.model_card import Normalisation
from dualloop.executor.model_runner import DecisionModel
from dualloop.ood.filter import filter_settings_from_dict
from dualloop.sim.env import ActionNoise, ExpertData, run_expert_batch
from dualloop.sim.realism import LONGITUDINAL_FEATURES
from dualloop.sim.scenarios import NOMINAL_SCENARIOS
from dualloop.sim.schema import FEATURE_NAMES
from dualloop.sim.sensors import TRAINING_SEES_LANE_ENDS
from dualloop.sim.world import DT

FIT_SEEDS = range(100_000, 100_012)  # disjoint from training, validation and demo seeds
CALIBRATION_SEEDS = range(110_000, 110_012)


def forward_rows(
    model: DecisionModel,
    features: np.ndarray,
    plan: np.ndarray,
    batch: int = 4096,
    present: np.ndarray | None = None,
    history: np.ndarray | None = None,
):
    """The model's outputs for many rows, normalised with the card as the executor does (NaN rows
    are zeroed for the forward pass, as the executor substitutes them); `present` (F,) bool: as a
    session measuring only those features is fed; `history` (N, H): the rows' history features, for a
    model that takes them (episode_history)."""
    if (history is None) != (model.history is None):
        raise ValueError(f"model {model.card.name} takes history features {model.card.history_names}: give them")
    norm = Normalisation.of(model.card)
    parts = []
    for a in range(0, len(features), batch):
        x = np.asarray(features[a : a + batch], np.float32)
        mask = None if present is None else np.broadcast_to(present, x.shape)
        if history is not None and model.history is not None:
            x = np.concatenate([x, np.asarray(history[a : a + batch], np.float32)], axis=1)
            if mask is not None:
                mask = np.concatenate([mask, model.history.present(mask)], axis=1)
        x, p, _ = norm.apply(x, np.asarray(plan[a : a + batch], np.float32), present=mask)
        parts.append(model.forward(x, p, mask))
    return (
        np.concatenate([o.logits for o in parts]),
        np.concatenate([o.controls for o in parts]),
        np.concatenate([o.decision_vector for o in parts]),
    )


def model_features(
    model: DecisionModel,
    features: np.ndarray,
    plan: np.ndarray,
    source: str,
    batch: int = 4096,
    history: np.ndarray | None = None,
) -> np.ndarray:
    """What the executor's gate sees for these inputs: decision vectors or raw features."""
    if source == "input_features":
        return features.astype(np.float32)
    return forward_rows(model, features, plan, batch, history=history)[2]


def fitting_rows(
    model: DecisionModel, features: np.ndarray, plan: np.ndarray, source: str, history: np.ndarray | None = None
) -> np.ndarray:
    """What a gate is fitted and calibrated on: `model_features`, and for a decision-vector gate on a
    model with mask inputs also the decision vectors of the same rows as a longitudinal session sees them."""
    if source == "input_features" or not model.card.mask_input:
        return model_features(model, features, plan, source, history=history)
    # A model with mask inputs meets sessions measuring everything and sessions measuring only the
    # longitudinal features, mostly without a plan of their own (executor.default_plan), and its
    # decision vector differs between them: the gate learns all of these.
    longitudinal = np.isin(np.array(model.card.feature_names), LONGITUDINAL_FEATURES)
    no_plan = DefaultPlan.of(model.card).rows(features)
    return np.concatenate(
        [
            forward_rows(model, features, plan, history=history)[2],
            forward_rows(model, features, no_plan, history=history)[2],
            forward_rows(model, features, no_plan, present=longitudinal, history=history)[2],
        ]
    )


def episode_times_ns(t: np.ndarray) -> np.ndarray:
    """The sensor timestamps (int ns) of an episode's ticks at times ``t`` (s), as a client sends them."""
    return np.round(np.asarray(t, np.float64) * 1e9).astype(np.int64)


def episode_changes(features: np.ndarray, t: np.ndarray, present: np.ndarray | None = None) -> np.ndarray:
    """Rates of change (B, T, F) float64, unit/s, of episodes (B, T, F) observed at times ``t`` (T,) s,
    as the executor's ood.ChangeTracker makes them for a session that sees each observation fresh (NaN
    where unknown), measuring every feature or only ``present`` ones ((F,) bool, the others NaN)."""
    b, t_len, f = features.shape
    tracker = ood.ChangeTracker(1, f)
    times = episode_times_ns(t)
    changes = np.full((b, t_len, f), np.nan)
    for i in range(b):
        tracker.reset(0)
        measured = features[i] if present is None else features[i][:, present]
        changes[i] = tracker.scan(features[i], np.isfinite(measured).all(axis=1), 0, times)
    return changes


def actuation_episodes(
    data: ExpertData,
    settings: ood.ActuationSettings = ood.ActuationSettings(),
    feature_names: Sequence[str] = FEATURE_NAMES,
) -> list[ood.ActuationEpisode]:
    """Expert episodes recorded at every tick as the actuation check sees them: the measured
    acceleration and speed, and the command the car was executing (what the step before applied,
    as a closed-loop client sends it); NaN where the row is not valid."""
    names = list(feature_names)
    accel_at, speed_at = names.index(settings.accel_feature), names.index(settings.speed_feature)
    t_ns = episode_times_ns(data.t)
    assert data.applied is not None  # run_expert_batch records it
    f64 = lambda a: a.astype(np.float64)  # noqa: E731
    return [
        ood.ActuationEpisode(
            t_ns,
            f64(data.features[b, :, accel_at]),
            f64(data.features[b, :, speed_at]),
            np.where(data.valid[b], f64(data.applied[b, :, 0]), np.nan),
        )
        for b in range(data.valid.shape[0])
    ]


def nominal_inputs(
    seeds: Sequence[int],
    every: int = 4,
    scenarios: Sequence[str] = NOMINAL_SCENARIOS,
    noise: ActionNoise | None = ActionNoise(),
    with_changes: bool = False,
    actuation: list[ood.ActuationEpisode] | None = None,
    history: HistoryDeriver | None = None,
    **params,
) -> tuple[np.ndarray, ...]:
    """(features, plan) rows from expert-driven nominal episodes, every `every`-th tick, valid rows
    only; with_changes: also each row's change since the tick before (a sensor at the tick rate).
    actuation: a list that gets every episode at every tick for the actuation check (needs with_changes,
    which records every tick). history: also each row's history features (last), from its episode's
    every 5 ms observation as one stream (executor.history.episode_history).

    With the same executed-action noise as the training data by default: the states a learned
    driver visits are a little off the expert's path, and a gate fitted on the clean path vetoed the
    model's own hard braking behind a braking lead."""
    feats, plans, changes, hists = [], [], [], []
    # changes and history features come from every 5 ms observation, as the executor receives them
    every_tick = with_changes or history is not None
    for name in scenarios:
        _, data = run_expert_batch(
            name,
            list(seeds),
            every=1 if every_tick else every,
            noise=noise,
            see_lane_ends=TRAINING_SEES_LANE_ENDS,
            **params,
        )
        pick = slice(None, None, every if every_tick else 1)
        valid = data.valid[:, pick]
        feats.append(data.features[:, pick][valid])
        plans.append(data.plan[:, pick][valid])
        if history is not None:
            hists.append(episode_history(history, data.t, data.features, data.valid)[:, pick][valid])
        if with_changes:
            changes.append(episode_changes(data.features, data.t)[:, pick][valid])
            if actuation is not None:
                actuation += actuation_episodes(data)
    out: tuple[np.ndarray, ...] = (np.concatenate(feats), np.concatenate(plans))
    if with_changes:
        out = (*out, np.concatenate(changes))
    return (*out, np.concatenate(hists)) if history is not None else out


def model_driven_inputs(
    model: DecisionModel, seeds: Sequence[int], every: int, scenarios: Sequence[str] = NOMINAL_SCENARIOS, **params
) -> tuple[np.ndarray, ...]:
    """(features, plan[, history]) rows, every `every`-th step, of nominal episodes the model drives
    itself (controller.training.rollouts: no gates), history from every 5 ms observation."""
    feats, plans, hists = [], [], []
    for name in scenarios:
        _, data = run_model_batch(model, name, list(seeds), see_lane_ends=TRAINING_SEES_LANE_ENDS, **params)
        valid = data.valid[:, ::every]
        feats.append(data.features[:, ::every][valid])
        plans.append(data.plan[:, ::every][valid])
        if model.history is not None:
            hists.append(episode_history(model.history, data.t, data.features, data.valid)[:, ::every][valid])
    out = (np.concatenate(feats), np.concatenate(plans))
    return (*out, np.concatenate(hists)) if model.history is not None else out


def _both(
    seeds: Sequence[int],
    every: int,
    params: dict,
    with_changes: bool,
    actuation: list[ood.ActuationEpisode] | None = None,
    history: HistoryDeriver | None = None,
) -> tuple[np.ndarray, ...]:
    """Rows from clean and from noise-injected nominal roll-outs, stacked."""
    clean = nominal_inputs(
        seeds, every, noise=None, with_changes=with_changes, actuation=actuation, history=history, **params
    )
    noisy = nominal_inputs(seeds, every, with_changes=with_changes, actuation=actuation, history=history, **params)
    return tuple(np.concatenate([a, b]) for a, b in zip(clean, noisy))


# The range guard's margin, as a fraction of each feature's training span, per source: the raw inputs
# have physical envelopes for their values and their changes (a speed far above training, a 3 m/s jump
# in 5 ms); the decision vector has none worth stating.
RANGE_MARGIN = {"decision_vector": None, "input_features": 0.25}
# What real sensors read, where the simulator's training range is narrower: a human's accelerations
# with measurement noise reach about +-8 m/s^2 (the simulated expert's stay within -7.5 and +2), real
# speeds 0-45 m/s, real gaps to a lead up to 250 m (the simulated sensor's range is 150 m; gaps derived
# from two vehicles' positions read down to -3.9 m with the lead close by: NGSIM, ZalaZone), relative
# speeds +-30 m/s. The range guard's value limits are these, or the training data's extremes where they
# lie beyond: the fitted margin never reaches past them (a gap of -35 m and a speed of -7.4 m/s passed).
# The gate's Mahalanobis score and norm guard still judge readings inside them by the training data.
PLAUSIBLE: dict[str, tuple[float, float]] = {
    "accel": (-8.0, 8.0),
    "speed": (0.0, 45.0),
    "gap": (-4.0, 250.0),
    "rel_speed": (-30.0, 30.0),
}
PLAUSIBLE_NOTE = "real sensors' readings: accelerations +-8 m/s^2, speed 0-45 m/s, gaps -4-250 m (position-derived "
PLAUSIBLE_NOTE += "gaps read below 0 with a lead close by), relative speeds +-30 m/s"


def _kind(name: str) -> str:
    """Which physical envelope of PLAUSIBLE a highway feature has ("" for none)."""
    if name.endswith("rel_speed"):
        return "rel_speed"
    if name.endswith("_gap") or name == "lead_distance":
        return "gap"
    if name.endswith("_accel"):
        return "accel"
    return "speed" if name == "ego_speed" else ""


# Held-out rows a raw-input gate keeps, to calibrate a sensor profile's threshold and norm band on (the
# band's conformal rank at norm_alpha 1e-4 needs 2 / 1e-4 - 1 of them): 20 000 rows are 1.5 MB of float32.
PROFILE_ROWS = 20_000
# How the freeze check tells a car at rest from a stuck sensor: a real speed sensor reads exactly 0 at
# standstill (the simulated one is noisy, so this never exempts a simulated repeat).
FREEZE = ood.FreezeSettings(speed_feature="ego_speed", rest_speed=0.1)
# The actuation check's per-observation rate before its k-of-n filter. Tighter than the gates' 1e-3:
# its smoothed shortfall is correlated from one observation to the next, so the filter removes few of
# its exceedances, and the nominal false-veto budget (0.1% per tick) is shared with the gates.
ACTUATION_ALPHA = 1e-4
# Real rows a raw-input gate keeps per site for its profiles' thresholds: a conformal quantile at alpha
# 1e-3 needs 999; 5,000 state it from the 5th largest (six sites of 14 features are 1.7 MB of float32).
SITE_ROWS_PER_SITE = 5_000


class GateFitConfig(BaseModel):
    """What `dualloop gate fit` configures: the gate's source and statistics, and the simulated nominal
    driving it is fitted and calibrated on."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    source: str = "decision_vector"  # one of executor.gating.GATE_SOURCES
    variant: str = "single"
    alpha: float = 1e-3
    norm_alpha: float = 1e-4
    fit_seeds: range | tuple[int, ...] = FIT_SEEDS
    calibration_seeds: range | tuple[int, ...] = CALIBRATION_SEEDS
    every: int = 4  # every n-th tick of an episode is a row
    filter_settings: dict[str, Any] | None = None  # None: the k-of-n default
    # a gate on the raw inputs also gets the actuation check (fitted lag, gain and offset from command to
    # measured acceleration, threshold on held-out driving)
    actuation: bool = True
    # a decision-vector gate also learns the model's own nominal driving on the same seeds
    model_driven: bool = True
    scenario_params: dict[str, Any] = {}  # the scenarios' own parameters (e.g. duration_s)
    # recorded ordinary drives (files or folders of dualloop logs), each dataset a site: the threshold
    # covers every site's own quantile (ood.sites), on the raw inputs per sensor profile
    real_logs: tuple[str, ...] = ()
    rows_per_site: int = SITE_ROWS_PER_SITE  # kept with a raw-input gate, evenly spaced


@dataclass(frozen=True, eq=False)
class _Rows:
    """One side (fit or calibration) of the simulated driving: features, plans and, as the source
    needs them, changes and history features."""

    features: np.ndarray
    plan: np.ndarray
    changes: np.ndarray | None
    history: np.ndarray | None


def _driving(
    model: DecisionModel, config: GateFitConfig, seeds: Sequence[int], actuation: list[ood.ActuationEpisode] | None
) -> _Rows:
    """Nominal driving both ways: the expert's own clean path, and the noise-injected roll-outs the
    model was trained on (a learned driver visits both); fitted on noisy roll-outs only, the gate
    vetoed the clean expert's merge from an ending on-ramp (0.35% false vetoes per tick). A
    decision-vector gate also gets the model's own nominal driving: where it drives differently from
    the expert (it brakes earlier and softer behind a hard-braking lead), an expert-only gate vetoed it
    on a dry road."""
    inputs = config.source == "input_features"
    # the decision vector of a model with history features needs them (the input gate reads the wire)
    hist = None if inputs else model.history
    x, p, *rest = _both(
        seeds, config.every, config.scenario_params, with_changes=inputs, actuation=actuation, history=hist
    )
    h = rest[-1] if hist is not None else None
    if not inputs and config.model_driven:
        own = model_driven_inputs(model, seeds, config.every, **config.scenario_params)
        x, p = np.concatenate([x, own[0]]), np.concatenate([p, own[1]])
        if h is not None:
            h = np.concatenate([h, own[2]])
    return _Rows(x, p, rest[0] if inputs else None, h)


def _description(model: DecisionModel, config: GateFitConfig) -> str:
    """What the calibration rows are, as the gate file states it (before the sampling rate)."""
    fit, cal = config.fit_seeds, config.calibration_seeds
    drivers = (
        "expert and model drivers" if config.source != "input_features" and config.model_driven else "expert driver"
    )
    description = (
        (
            f"simulated nominal driving ({', '.join(NOMINAL_SCENARIOS)}), {drivers}, fit seeds "
            f"{fit.start}-{fit.stop - 1}, calibration seeds {cal.start}-{cal.stop - 1}"
        )
        if isinstance(fit, range) and isinstance(cal, range)
        else "simulated nominal"
    )
    if config.source == "decision_vector" and model.card.mask_input:
        description += (
            "; decision vectors as sessions see them that measure every feature (with the expert's plan "
            "and with none) and only the longitudinal ones (with none)"
        )
    return description


def _raised_plan_fields(model: DecisionModel) -> tuple[tuple[int, int], ...]:
    """(plan column, feature column) of each plan field the card's no-plan default raises to a feature:
    the plan range must take that field up to the feature's range (a motorway speed with no plan is
    the target speed, and the input range judges the speed itself)."""
    card = model.card
    plan_names = [p.name for p in card.plan]
    return tuple(
        (plan_names.index(field), card.feature_names.index(feature))
        for field, feature in card.plan_default_at_least.items()
    )


def _fit_settings(model: DecisionModel, config: GateFitConfig) -> ood.GateFitSettings:
    """What `ood.fit_gate` is told: the config's statistics, and for the raw inputs the range guard
    with its physical envelope and the rows kept for sensor profiles."""
    inputs = config.source == "input_features"
    margin = RANGE_MARGIN[config.source]
    range_settings = (
        None
        if margin is None
        else ood.RangeSettings(
            margin=margin,
            change_note=f"per second, measured between observations {1000 * DT:g} ms apart (simulated sensors "
            "at the tick rate)"
            if inputs
            else "",
            context_names=tuple(p.name for p in model.card.plan) if inputs else (),
            envelope=tuple(PLAUSIBLE.get(_kind(name)) for name in FEATURE_NAMES) if inputs else None,
            envelope_note=PLAUSIBLE_NOTE if inputs else "",
            context_at_least=_raised_plan_fields(model) if inputs else (),
        )
    )
    settings = config.filter_settings
    return ood.GateFitSettings(
        variant=config.variant,
        alpha=config.alpha,
        norm_alpha=config.norm_alpha,
        filter=ood.KOfNSettings() if settings is None else filter_settings_from_dict(settings),
        range=range_settings,
        keep_calibration_rows=PROFILE_ROWS if inputs else 0,
    )


def fit_gate_for_model(model: DecisionModel, config: GateFitConfig | None = None) -> ood.Gate:
    """A gate for `model` as `config` says (by default: on its decision vector); a gate on the raw
    inputs also gets the actuation check unless `config.actuation` is False."""
    config = GateFitConfig() if config is None else config
    source = config.source
    if source not in GATE_SOURCES:
        raise ValueError(f"source must be one of {GATE_SOURCES}, got {source!r}")
    inputs = source == "input_features"
    act_fit: list[ood.ActuationEpisode] | None = [] if inputs and config.actuation else None
    act_cal: list[ood.ActuationEpisode] | None = [] if inputs and config.actuation else None
    fit, cal = (
        _driving(model, config, config.fit_seeds, act_fit),
        _driving(model, config, config.calibration_seeds, act_cal),
    )
    card = model.card
    description = _description(model, config)
    gate = ood.fit_gate(
        # the range guard limits the raw inputs' changes and the plan they come with
        ood.FeatureRows(
            fitting_rows(model, fit.features, fit.plan, source, fit.history), fit.changes, fit.plan if inputs else None
        ),
        ood.FeatureRows(
            fitting_rows(model, cal.features, cal.plan, source, cal.history), cal.changes, cal.plan if inputs else None
        ),
        ood.FeatureSchema(tuple(gate_feature_names(model, source)), source),
        f"{description}, every {config.every} ticks; model {card.name} {card.version}"
        if isinstance(config.fit_seeds, range)
        else description,
        _fit_settings(model, config),
    )
    # a car at rest repeats its observations exactly (speed 0, accel 0, the same gap): not a freeze; and
    # the model it describes: the serving path refuses the gate in front of another one
    gate = dataclasses.replace(
        gate, freeze=FREEZE, model=ood.ModelRef(name=card.name, version=card.version, schema_hash=card.schema_hash())
    )
    if config.real_logs:
        gate = calibrate_on_sites(model, gate, config)
    if act_fit is None:
        return gate
    assert act_cal is not None  # made with act_fit
    # clean and noise-injected roll-outs alike: the command is what was executed, noise included
    check = ood.fit_actuation_check(
        act_fit,
        act_cal,
        ACTUATION_ALPHA,
        f"{description}, clean and noise-injected roll-outs, every tick with a command while moving "
        f"(the command the previous {1000 * DT:g} ms step applied)"
        if isinstance(config.fit_seeds, range)
        else description,
    )
    check.indices(card.feature_names, [c.name for c in card.controls])  # refuse a model it cannot read
    return dataclasses.replace(gate, actuation=check)


def calibrate_on_sites(model: DecisionModel, gate: ood.Gate, config: GateFitConfig) -> ood.Gate:
    """``gate`` with its threshold covering ordinary driving at each site of ``config.real_logs`` (one
    site per dataset; ood.sites): a raw-input gate keeps a sample of each site's rows, from which every
    sensor profile's threshold is raised (ood.marginal.profile_gate); a decision-vector gate's one
    threshold is raised to the largest site quantile of the model's decision vectors on the drives."""
    rows = read_log_rows(config.real_logs)
    valid = rows.valid
    sites = rows.dataset[valid]
    if gate.schema.source == "input_features":
        measured = np.where(rows.present, rows.features, np.nan)[valid]
        return dataclasses.replace(gate, site_rows=ood.sample_site_rows(measured, sites, config.rows_per_site))
    names = sorted(set(sites.tolist()))
    scores, _ = ood.score_in_chunks(ood.GateScorer(gate.stats), decision_vectors(model, rows, valid))
    index = np.searchsorted(names, sites)
    quantiles = ood.site_quantiles(scores, index, names, gate.calibration.alpha)
    if not quantiles or max(quantiles.values()) <= gate.threshold:
        return gate
    site, top = max(quantiles.items(), key=lambda kv: kv[1])
    listed = ", ".join(f"{n} {q:.4g}" for n, q in quantiles.items())
    note = (
        f"; raised from {gate.threshold:.6g} to the largest site quantile (ood.sites), {site}'s, of the "
        f"model's decision vectors on real drives ({listed})"
    )
    calibration = dataclasses.replace(
        gate.calibration, threshold=top, data_description=gate.calibration.data_description + note
    )
    return dataclasses.replace(gate, calibration=calibration)
