"""`ds.sbml.load`: SBML features against closed forms (volumes, amounts, rules, initial
assignments, function definitions, piecewise), the published models of the PEtab collection
against the same models written by hand, and files it refuses with the element named."""

import dataclasses
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import diffsim as ds
import models

PETAB = Path(__file__).resolve().parents[1] / "experiments" / "data" / "petab"

_HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    '<sbml xmlns="http://www.sbml.org/sbml/level3/version2/core" level="3" version="2">'
    '<model id="m">'
)
_TAIL = "</model></sbml>"
_MATH = '<math xmlns="http://www.w3.org/1998/Math/MathML">{}</math>'


def _write(tmp_path, body: str, name: str = "model.xml") -> Path:
    path = tmp_path / name
    path.write_text(_HEAD + body + _TAIL)
    return path


def _compartment(cid="c", size=2.0):
    return f'<compartment id="{cid}" size="{size}" constant="true"/>'


def _species(sid, initial, amount=False, kind="Concentration", boundary=False):
    flags = f'hasOnlySubstanceUnits="{str(amount).lower()}" '
    flags += f'boundaryCondition="{str(boundary).lower()}" constant="false"'
    return f'<species id="{sid}" compartment="c" initial{kind}="{initial}" {flags}/>'


def _decay(product=False):
    reference = '<speciesReference species="B" stoichiometry="1" constant="true"/>'
    products = f"<listOfProducts>{reference}</listOfProducts>" if product else ""
    return (
        '<listOfReactions><reaction id="r" reversible="false">'
        '<listOfReactants><speciesReference species="A" stoichiometry="1" constant="true"/>'
        f"</listOfReactants>{products}<kineticLaw>"
        + _MATH.format("<apply><times/><ci>k</ci><ci>A</ci></apply>")
        + "</kineticLaw></reaction></listOfReactions>"
    )


def _solve(model, y0, ts):
    return ds.simulate(model, y0, ts, solver=ds.Tsit5(rtol=1e-10, atol=1e-12)).ys


TS = jnp.linspace(0.0, 3.0, 7)


def test_a_reaction_changes_a_concentration_by_its_rate_over_the_volume(tmp_path):
    """A → B at rate k·A (amount per time, as SBML's kinetic laws are) in a compartment of
    volume 2: d[A]/dt = −k[A]/2; B, in amount units, gains the whole rate."""
    body = (
        f"<listOfCompartments>{_compartment()}</listOfCompartments><listOfSpecies>"
        + _species("A", 3.0)
        + _species("B", 0.0, amount=True, kind="Amount")
        + '</listOfSpecies><listOfParameters><parameter id="k" value="0.4" constant="true"/>'
        "</listOfParameters>" + _decay(product=True)
    )
    model = ds.sbml.load(_write(tmp_path, body))
    assert model.state_names == ("A", "B") and set(model.params) == {"c", "k"}
    y0 = model.initial_state()
    np.testing.assert_allclose(y0, [3.0, 0.0])
    ys = _solve(model, y0, TS)
    a = 3.0 * np.exp(-0.2 * np.asarray(TS))
    np.testing.assert_allclose(ys[:, 0], a, rtol=1e-9)
    # B (amount) = volume × what A (concentration) lost
    np.testing.assert_allclose(ys[:, 1], 2.0 * (3.0 - a), rtol=1e-9, atol=1e-12)


def test_an_unset_stoichiometry_in_level_3_is_taken_as_1_with_a_warning(tmp_path):
    """Level 3 leaves a species reference without `stoichiometry` undefined: the load warns
    (naming the species and the reaction) and takes 1."""
    body = (
        f"<listOfCompartments>{_compartment()}</listOfCompartments><listOfSpecies>"
        + _species("A", 3.0)
        + '</listOfSpecies><listOfParameters><parameter id="k" value="0.4" constant="true"/>'
        "</listOfParameters>" + _decay().replace(' stoichiometry="1"', "")
    )
    with pytest.warns(UserWarning, match="stoichiometry of A in reaction r is not set"):
        model = ds.sbml.load(_write(tmp_path, body))
    ys = _solve(model, model.initial_state(), TS)
    np.testing.assert_allclose(ys[:, 0], 3.0 * np.exp(-0.2 * np.asarray(TS)), rtol=1e-9)


def _switch_model(tmp_path, at="<cn>1</cn>"):
    """x' = 1 while t < `at`, then 0 (a piecewise of time in a rate rule): x = min(t, 1)
    for at = 1; a parameter c = 1 is there to be read instead."""
    body = (
        f"<listOfCompartments>{_compartment('cell', size=1.0)}</listOfCompartments>"
        '<listOfParameters><parameter id="x" value="0" constant="false"/>'
        '<parameter id="c" value="1" constant="true"/></listOfParameters>'
        '<listOfRules><rateRule variable="x">'
        + _MATH.format(
            '<piecewise><piece><cn>1</cn><apply><lt/><csymbol encoding="text" '
            'definitionURL="http://www.sbml.org/sbml/symbols/time">t</csymbol>'
            f"{at}</apply></piece><otherwise><cn>0</cn></otherwise></piecewise>"
        )
        + "</rateRule></listOfRules>"
    )
    return ds.sbml.load(_write(tmp_path, body, name=f"switch{len(at)}.xml"))


def test_a_switch_on_time_stops_the_solver_and_each_side_keeps_its_own_field(tmp_path):
    """Simulated alone, x' = (1 while t < 1) switches inside a step: x(2) is only near 1
    (the next test). As an experiment's changes (`model.changes()`), the solve stops at
    t = 1 and integrates [0, 1] with x' = 1 and [1, 2] with x' = 0 throughout, their end
    points included: x = min(t, 1) to round-off."""
    model = _switch_model(tmp_path)
    assert model.time_switches == ("after:1.0",)
    assert model.params["after:1.0"] == -1.0  # by default the comparison reads the time
    assert model.changes() == [(0.0, {"after:1.0": 0.0}), (1.0, {"after:1.0": 1.0})]
    assert model.changes(t0=1.5) == [(1.5, {"after:1.0": 1.0})]
    times = np.array([0.5, 0.999, 1.0, 1.5, 2.0])
    problem = ds.Problem(
        model,
        [
            ds.Experiment(
                {"time": times, "observable": ["x"] * times.size, "value": np.ones(times.size)},
                y0=model.initial_state(),
                changes=model.changes(),
            )
        ],
        {"x": ds.Observable(lambda t, y, p: y[0], sigma=1.0)},
        {},
        solver=ds.Tsit5(rtol=1e-6, atol=1e-9),
    )
    [predicted] = problem.predictions()
    np.testing.assert_allclose(predicted["prediction"], np.minimum(times, 1.0), atol=1e-12)
    # a switch time read from a parameter: from its setting; never (inf), or moved by the
    # experiment's own changes: no stop, the comparison reads the time
    read = _switch_model(tmp_path, at="<ci>c</ci>")
    assert read.time_switches == ("after:c",)
    assert read.changes({"c": 2.0}) == [(0.0, {"after:c": 0.0}), (2.0, {"after:c": 1.0})]
    assert read.changes({"c": float("inf")}) == []
    assert read.changes({"c": 2.0}, varying={"c"}) == []
    # estimated (a name, as ds.petab passes it): derivatives would miss the switch's move
    with pytest.warns(UserWarning, match="switch on time at c reads c, which is estimated"):
        assert read.changes({"c": "c"}) == []


def test_rules_initial_assignments_functions_and_piecewise(tmp_path):
    """x' = piecewise(1 if t < 1, else 0) (a rate rule on a parameter): x = min(t, 1); the
    decay rate is an assignment rule through a function definition, double(kh) = 2 kh; A's
    initial concentration is an initial assignment 3 kh + 1."""
    function = (
        '<listOfFunctionDefinitions><functionDefinition id="double">'
        + _MATH.format(
            "<lambda><bvar><ci>v</ci></bvar><apply><times/><cn>2</cn><ci>v</ci></apply></lambda>"
        )
        + "</functionDefinition></listOfFunctionDefinitions>"
    )
    body = (
        function
        + f"<listOfCompartments>{_compartment(size=1.0)}</listOfCompartments><listOfSpecies>"
        + _species("A", 0.0)
        + '</listOfSpecies><listOfParameters><parameter id="kh" value="0.25" constant="true"/>'
        '<parameter id="k" constant="false"/><parameter id="x" value="0" constant="false"/>'
        '</listOfParameters><listOfInitialAssignments><initialAssignment symbol="A">'
        + _MATH.format(
            "<apply><plus/><apply><times/><cn>3</cn><ci>kh</ci></apply><cn>1</cn></apply>"
        )
        + "</initialAssignment></listOfInitialAssignments><listOfRules>"
        '<assignmentRule variable="k">'
        + _MATH.format("<apply><ci>double</ci><ci>kh</ci></apply>")
        + '</assignmentRule><rateRule variable="x">'
        + _MATH.format(
            '<piecewise><piece><cn>1</cn><apply><lt/><csymbol encoding="text" '
            'definitionURL="http://www.sbml.org/sbml/symbols/time">t</csymbol><cn>1</cn></apply>'
            "</piece><otherwise><cn>0</cn></otherwise></piecewise>"
        )
        + "</rateRule></listOfRules>"
        + _decay()
    )
    model = ds.sbml.load(_write(tmp_path, body))
    assert model.state_names == ("A", "x") and "k" not in model.params  # k is computed
    y0 = model.initial_state()
    np.testing.assert_allclose(y0, [1.75, 0.0])
    np.testing.assert_allclose(model.initial_state({"kh": 1.0}), [4.0, 0.0])  # a setting
    ys = _solve(model, y0, jnp.array([0.0, 0.5, 0.999, 2.0]))
    np.testing.assert_allclose(
        ys[:, 0], 1.75 * np.exp(-0.5 * np.array([0.0, 0.5, 0.999, 2.0])), rtol=1e-8
    )
    np.testing.assert_allclose(ys[:3, 1], [0.0, 0.5, 0.999], atol=1e-9)
    assert float(ys[3, 1]) == pytest.approx(1.0, abs=1e-3)  # a switch inside a step
    assert float(model.value("k", 0.0, y0)) == 0.5


@pytest.mark.parametrize(
    "hand, folder",
    [
        (models.BoehmSTAT5, "Boehm_JProteomeRes2014"),
        (models.FujitaAkt, "Fujita_SciSignal2010"),
        (models.BrunoCarotenoids, "Bruno_JExpBot2016"),
    ],
    ids=["Boehm", "Fujita", "Bruno"],
)
def test_published_models_equal_the_same_models_written_by_hand(hand, folder):
    """The SBML files of three PEtab studies against models.signalling (written from them by
    hand): the same states and parameters, and the same vector field at random states to
    round-off."""
    (path,) = (PETAB / folder).glob("model_*.xml")
    model = ds.sbml.load(path)
    fields = [f.name for f in dataclasses.fields(hand)]
    written = hand(**{name: model.params[name] for name in fields})
    assert model.state_names == written.state_names
    rng = np.random.default_rng(0)
    for _ in range(3):
        y = jnp.asarray(rng.uniform(0.0, 10.0, len(written.state_names)))
        np.testing.assert_allclose(
            model.vector_field(30.0, y), written.vector_field(30.0, y), rtol=1e-13, atol=1e-13
        )


def test_files_it_cannot_read_are_refused_naming_the_element(tmp_path):
    with pytest.raises(FileNotFoundError, match="no file at"):
        ds.sbml.load(tmp_path / "missing.xml")
    (tmp_path / "broken.xml").write_text("<sbml><model")
    with pytest.raises(ds.sbml.SBMLError, match="broken.xml is not a valid SBML file"):
        ds.sbml.load(tmp_path / "broken.xml")
    # ids nothing defines: a kinetic law's parameter (k), a species' compartment
    undefined = f"<listOfCompartments>{_compartment()}</listOfCompartments><listOfSpecies>"
    undefined += _species("A", 1.0) + "</listOfSpecies>" + _decay()
    with pytest.raises(ds.sbml.SBMLError, match=r"kineticLaw> uses 'k' that is not the id"):
        ds.sbml.load(_write(tmp_path, undefined, "no_k.xml"))
    nowhere = undefined.replace('compartment="c"', 'compartment="nowhere"')
    with pytest.raises(
        ds.sbml.SBMLError, match="id 'A' refers to the compartment 'nowhere' which is not defined"
    ):
        ds.sbml.load(_write(tmp_path, nowhere, "nowhere.xml"))
    event = (
        f"<listOfCompartments>{_compartment()}</listOfCompartments><listOfSpecies>"
        + _species("A", 1.0)
        + '</listOfSpecies><listOfEvents><event id="dose" useValuesFromTriggerTime="true">'
        '<trigger initialValue="false" persistent="true">'
        + _MATH.format(
            '<apply><gt/><csymbol encoding="text" definitionURL="http://www.sbml.org/sbml/symbols/time">t</csymbol><cn>1</cn></apply>'
        )
        + '</trigger><listOfEventAssignments><eventAssignment variable="A">'
        + _MATH.format("<cn>2</cn>")
        + "</eventAssignment></listOfEventAssignments></event></listOfEvents>"
    )
    # a time-triggered event is read (as changes at given times, `ds.Experiment(changes=)`);
    # its trigger is already true at t0 = 1.5 (initialValue false: it fires there)
    timed = ds.sbml.load(_write(tmp_path, event, "event.xml"))
    [(time, assignments)] = timed.changes()
    assert time == 1.0 and assignments["A"](jnp.array([5.0]), timed.params) == 2.0
    assert [t for t, _ in timed.changes(t0=1.5)] == [1.5]
    assert timed.changes(t0=1.5, values={"unused": 1.0})[0][0] == 1.5
    # with initialValue true it fires only by a transition: `time > 1` goes false -> true
    # just after t0 = 1, but is true throughout from t0 = 1.5
    true_start = ds.sbml.load(
        _write(tmp_path, event.replace('initialValue="false"', 'initialValue="true"'), "t.xml")
    )
    assert [t for t, _ in true_start.changes(t0=1.0)] == [1.0]
    assert true_start.changes(t0=1.5) == []
    # a priority (the order of events at one instant) that is not a constant: refused
    ranked = event.replace("</trigger>", "</trigger><priority>" + _MATH.format("<ci>A</ci>"))
    ranked = ranked.replace("<listOfEventAssignments>", "</priority><listOfEventAssignments>")
    with pytest.raises(ds.sbml.SBMLError, match="event dose's priority A .a constant number"):
        ds.sbml.load(_write(tmp_path, ranked, "ranked.xml"))
    # a trigger other than a comparison (events triggered by the state: the next test) is not
    both = event.replace(
        "<apply><gt/>", "<apply><and/><apply><lt/><ci>A</ci><cn>3</cn></apply><apply><gt/>"
    ).replace("<cn>1</cn></apply>", "<cn>1</cn></apply></apply>", 1)
    with pytest.raises(ds.sbml.SBMLError, match="event dose's trigger .*A < 3.* does not support"):
        ds.sbml.load(_write(tmp_path, both, "both.xml"))
    algebraic = (
        f"<listOfCompartments>{_compartment()}</listOfCompartments><listOfSpecies>"
        + _species("A", 1.0)
        + "</listOfSpecies><listOfRules><algebraicRule>"
        + _MATH.format("<apply><minus/><ci>A</ci><cn>1</cn></apply>")
        + "</algebraicRule></listOfRules>"
    )
    with pytest.raises(ds.sbml.SBMLError, match="an algebraic rule, which diffsim does not"):
        ds.sbml.load(_write(tmp_path, algebraic, "algebraic.xml"))
    converted = (
        f"<listOfCompartments>{_compartment()}</listOfCompartments><listOfSpecies>"
        + _species("A", 1.0)
        + '</listOfSpecies><listOfParameters><parameter id="cf" value="2" constant="true"/>'
        "</listOfParameters>"
    )
    path = _write(tmp_path, converted, "converted.xml")
    path.write_text(
        path.read_text().replace('<model id="m">', '<model id="m" conversionFactor="cf">')
    )
    with pytest.raises(ds.sbml.SBMLError, match="the model's conversion factor cf"):
        ds.sbml.load(path)
    # a package the file requires changes what it means (comp: submodels)
    path.write_text(
        path.read_text().replace(
            'level="3" version="2">',
            'xmlns:comp="http://www.sbml.org/sbml/level3/version1/comp/version1" level="3" '
            'version="2" comp:required="true">',
        )
    )
    with pytest.raises(ds.sbml.SBMLError, match="the SBML package 'comp', which the file req"):
        ds.sbml.load(path)
    # level 3 version 2 lets an element leave out its math; such an element is not read
    no_math = converted + '<listOfInitialAssignments><initialAssignment symbol="cf"/>'
    no_math += "</listOfInitialAssignments>"
    with pytest.raises(ds.sbml.SBMLError, match="initial assignment of cf has no math"):
        ds.sbml.load(_write(tmp_path, no_math, "no_math.xml"))
    # true and false are 1 and 0 where a number is expected (a kinetic law of `true`)
    always = (
        f"<listOfCompartments>{_compartment(size=1.0)}</listOfCompartments><listOfSpecies>"
        + _species("A", 3.0)
        + "</listOfSpecies>"
        + _decay().replace("<apply><times/><ci>k</ci><ci>A</ci></apply>", "<true/>")
    )
    constant_rate = ds.sbml.load(_write(tmp_path, always, "always.xml"))
    assert float(constant_rate.vector_field(0.0, jnp.array([3.0]))[0]) == -1.0


def _event(eid, trigger, assignments, initial="true"):
    sets = "".join(
        f'<eventAssignment variable="{variable}">{_MATH.format(value)}</eventAssignment>'
        for variable, value in assignments.items()
    )
    return (
        f'<event id="{eid}" useValuesFromTriggerTime="true"><trigger initialValue="{initial}" '
        f'persistent="true">{_MATH.format(trigger)}</trigger>'
        f"<listOfEventAssignments>{sets}</listOfEventAssignments></event>"
    )


def test_events_triggered_by_the_state_fire_where_their_trigger_turns_true(tmp_path):
    """A -> at rate k·A in c (size 1), A0 = 4, redosed by 5 when A < 1: A = 4 e^(-k t) up to
    t1 = ln 4 / k, then 6 e^(-k (t - t1)) = 24 e^(-k t) (next dose at t1 + ln 6 / k > 6),
    so dA/dk = -t A on both sides, the event time's own derivative included; B' = v with
    v = 1 until B >= 1.8 sets v = 0 (a parameter an event of the state sets: a state), so
    B = min(t, 1.8)."""
    k = 0.5
    events = _event(
        "redose",
        "<apply><lt/><ci>A</ci><cn>1</cn></apply>",
        {"A": "<apply><plus/><ci>A</ci><ci>dose</ci></apply>"},
    ) + _event("stop", "<apply><geq/><ci>B</ci><cn>1.8</cn></apply>", {"v": "<cn>0</cn>"})
    body = (
        f"<listOfCompartments>{_compartment(size=1.0)}</listOfCompartments>"
        f"<listOfSpecies>{_species('A', 4.0)}</listOfSpecies><listOfParameters>"
        f'<parameter id="k" value="{k}" constant="true"/>'
        '<parameter id="dose" value="5" constant="true"/>'
        '<parameter id="v" value="1" constant="false"/>'
        '<parameter id="B" value="0" constant="false"/></listOfParameters>'
        '<listOfRules><rateRule variable="B">' + _MATH.format("<ci>v</ci>") + "</rateRule>"
        "</listOfRules>" + _decay() + f"<listOfEvents>{events}</listOfEvents>"
    )
    model = ds.sbml.load(_write(tmp_path, body))
    assert model.triggered_events == ("redose", "stop") and model.timed_events == ()
    assert model.state_names == ("A", "v", "B") and "v" not in model.params
    y0 = model.initial_state()
    np.testing.assert_allclose(y0, [4.0, 1.0, 0.0])
    ts = jnp.linspace(0.0, 6.0, 13)
    solver = ds.Tsit5(rtol=1e-10, atol=1e-12)

    def solve(k):
        moved = eqx.tree_at(lambda m: m.params["k"], model, k)
        return ds.simulate(moved, y0, ts, solver=solver)  # with the model's own events

    # values and derivatives from one program
    (ys, event_times), (slope, moved) = jax.jvp(
        lambda k: (lambda s: (s.ys, s.event_time))(solve(k)), (jnp.asarray(k),), (1.0,)
    )
    t1 = np.log(4.0) / k
    t = np.asarray(ts)
    a = np.where(t < t1, 4.0, 24.0) * np.exp(-k * t)
    # Tsit5 at rtol 1e-10 over a few dozen steps: values and the event times (roots of its
    # dense output) to 1e-8; the tangents take the same steps without error control of their
    # own: 1e-6
    np.testing.assert_allclose(ys[:, 0], a, rtol=1e-8)
    np.testing.assert_allclose(ys[:, 2], np.minimum(t, 1.8), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(ys[:, 1], np.where(t < 1.8, 1.0, 0.0))
    assert float(event_times[0][0]) == pytest.approx(t1, rel=1e-8)
    assert float(event_times[1][0]) == pytest.approx(1.8, rel=1e-8)
    np.testing.assert_allclose(slope[:, 0], -t * a, rtol=1e-6, atol=1e-9)
    assert float(moved[0][0]) == pytest.approx(-np.log(4.0) / k**2, rel=1e-6)
    # events of one's own must come with the model's
    stop = ds.Event(lambda t, y: y[0] - 0.1, terminal=True)
    with pytest.raises(ValueError, match=r"\(redose, stop\), and events= does not hold them"):
        ds.simulate(model, y0, ts, solver=solver, events=stop)
    # a trigger true at the start fires there only where its initial value is false
    low = jnp.array([0.5, 1.0, 0.0])
    np.testing.assert_allclose(model.fire_on_jump(0.0, None, low), low)
    eager = body.replace('initialValue="true"', 'initialValue="false"', 1)
    eager = ds.sbml.load(_write(tmp_path, eager, "eager.xml"))
    np.testing.assert_allclose(eager.fire_on_jump(0.0, None, low), [5.5, 1.0, 0.0])
    # and a jump that makes it true (a change at a period's start) fires it
    np.testing.assert_allclose(
        model.fire_on_jump(3.0, jnp.array([2.0, 1.0, 0.0]), low), [5.5, 1.0, 0.0]
    )
    np.testing.assert_allclose(model.fire_on_jump(3.0, low, low), low)
    # events of one trigger fire together (as one ds.Event: a solve fires only the first of
    # events that cross at one instant)
    also = _event("also", "<apply><lt/><ci>A</ci><cn>1</cn></apply>", {"v": "<cn>7</cn>"})
    twice = ds.sbml.load(
        _write(tmp_path, body.replace("</listOfEvents>", also + "</listOfEvents>"), "2.xml")
    )
    assert twice.triggered_events == ("redose", "also", "stop")
    assert len(twice.state_events()) == 2
    np.testing.assert_allclose(
        twice.fire_on_jump(3.0, jnp.array([2.0, 1.0, 0.0]), low), [5.5, 7.0, 0.0]
    )


def test_a_problem_fits_through_an_event_triggered_by_the_state(tmp_path):
    """The redosing of the test above in a `ds.Problem` (which passes the model's events to
    its solves itself): its log-likelihood at k = 0.5 on the closed form's values is the
    noise terms' alone, and a fit from k = 0.3 (the dose then at t = 4.6 instead of 2.8)
    reaches k = 0.5 through the forward-mode Jacobian of solves with the event."""
    k = 0.5
    redose = _event(
        "redose",
        "<apply><lt/><ci>A</ci><cn>1</cn></apply>",
        {"A": "<apply><plus/><ci>A</ci><ci>dose</ci></apply>"},
    )
    body = (
        f"<listOfCompartments>{_compartment(size=1.0)}</listOfCompartments>"
        f"<listOfSpecies>{_species('A', 4.0)}</listOfSpecies><listOfParameters>"
        f'<parameter id="k" value="{k}" constant="true"/>'
        '<parameter id="dose" value="5" constant="true"/></listOfParameters>'
        + _decay()
        + f"<listOfEvents>{redose}</listOfEvents>"
    )
    model = ds.sbml.load(_write(tmp_path, body))
    ts = np.linspace(0.5, 6.0, 12)
    a = np.where(ts < np.log(4.0) / k, 4.0, 24.0) * np.exp(-k * ts)
    problem = ds.Problem(
        model,
        experiments=[
            ds.Experiment(
                {"time": ts, "observable": ["A"] * ts.size, "value": a}, y0=model.initial_state()
            )
        ],
        observables={"A": ds.Observable(lambda t, y, p: y[0], sigma=0.1)},
        unknowns={"k": ds.Unknown(0.3, bounds=(0.01, 10.0), scale="log10")},
    )
    # the data are the closed form: at k = 0.5 the residuals are the solves' error over σ
    # (~1e-7 at most), whose squares are round-off beside 1e-7
    noise_alone = -ts.size * 0.5 * np.log(2 * np.pi * 0.1**2)
    assert problem.llh({"k": k}) == pytest.approx(noise_alone, abs=1e-7)
    fit = ds.fit(problem, starts=1, progress=False)
    # the optimum is k = 0.5 up to the solves' error; 1e-6 leaves the optimiser's stopping
    # tolerance room
    assert fit.params["k"] == pytest.approx(k, rel=1e-6)


_TIME = '<csymbol encoding="text" definitionURL="http://www.sbml.org/sbml/symbols/time">t</csymbol>'


def test_simulate_runs_time_triggered_events_at_their_times(tmp_path):
    """A -> at rate k·A (c of size 1), A0 = 1, dosed by D = 2 when time >= td (a parameter,
    1.5), and an event at time >= 2 that sets B = 7 and halves k (a parameter, which the
    solve carries as a state). Closed form: A = e^(-k t), then (e^(-k td) + D) e^(-k (t - td))
    up to 2, then that at 2 times e^(-k/2 (t - 2)); so dA/dtd = k D e^(-k (t - td)) between
    the events and k D e^(-k (2 - td)) e^(-k/2 (t - 2)) after both (the event time's
    derivative). The dose makes A > 2 true, which fires an event triggered by the state at
    that instant (hit = 1). Outputs at td and at 2 report the state after the events (SBML's
    rule, as a ds.Problem's changes). With td = 2 the two events act at one instant."""
    k, dose, td = 0.5, 2.0, 1.5
    halve = "<apply><divide/><ci>k</ci><cn>2</cn></apply>"
    events = (
        _event(
            "dose",
            f"<apply><geq/>{_TIME}<ci>td</ci></apply>",
            {"A": "<apply><plus/><ci>A</ci><ci>D</ci></apply>"},
        )
        + _event("same", f"<apply><geq/>{_TIME}<cn>2</cn></apply>", {"B": "<cn>7</cn>", "k": halve})
        + _event("hit", "<apply><gt/><ci>A</ci><cn>2</cn></apply>", {"h": "<cn>1</cn>"})
    )
    body = (
        f"<listOfCompartments>{_compartment(size=1.0)}</listOfCompartments>"
        f"<listOfSpecies>{_species('A', 1.0)}{_species('B', 0.0)}</listOfSpecies>"
        f'<listOfParameters><parameter id="k" value="{k}" constant="false"/>'
        f'<parameter id="D" value="{dose}" constant="true"/>'
        f'<parameter id="td" value="{td}" constant="true"/>'
        '<parameter id="h" value="0" constant="false"/></listOfParameters>'
        + _decay()
        + f"<listOfEvents>{events}</listOfEvents>"
    )
    model = ds.sbml.load(_write(tmp_path, body))
    assert model.timed_events == ("dose", "same") and model.triggered_events == ("hit",)
    assert model.state_names == ("A", "B", "h") and model.moved_by_time_events == ("k",)
    y0 = model.initial_state()
    ts = jnp.linspace(0.0, 4.0, 9)  # 1.5 and 2.0 among them
    solver = ds.Tsit5(rtol=1e-10, atol=1e-12)

    def solve(td):
        moved = eqx.tree_at(lambda m: m.params["td"], model, td)
        return ds.simulate(moved, y0, ts, solver=solver).ys

    def closed(td):
        t = np.asarray(ts)
        dosed = (np.exp(-k * td) + dose) * np.exp(-k * (np.minimum(t, 2.0) - td))
        a = np.where(t < td, np.exp(-k * t), dosed * np.exp(-k / 2 * np.maximum(t - 2.0, 0.0)))
        return t, a

    ys, slope = jax.jvp(solve, (jnp.asarray(td),), (1.0,))
    t, a = closed(td)
    # Tsit5 at rtol 1e-10: values to 1e-8 (as the test of state events above); the tangents
    # take the same steps without error control of their own: 1e-6
    np.testing.assert_allclose(ys[:, 0], a, rtol=1e-8)
    np.testing.assert_allclose(ys[:, 1], np.where(t >= 2.0, 7.0, 0.0))
    np.testing.assert_allclose(ys[:, 2], np.where(t >= td, 1.0, 0.0))
    between, after = (t > td) & (t < 2.0), t > 2.0  # at td the output sits on the moving jump
    np.testing.assert_allclose(
        slope[between, 0], k * dose * np.exp(-k * (t[between] - td)), rtol=1e-6
    )
    expected = k * dose * np.exp(-k * (2.0 - td)) * np.exp(-k / 2 * (t[after] - 2.0))
    np.testing.assert_allclose(slope[after, 0], expected, rtol=1e-6)
    np.testing.assert_allclose(slope[t < td, 0], 0.0, atol=1e-12)
    # td = 2: both events at one instant (the value at 2 after both)
    t, a = closed(2.0)
    both = np.asarray(solve(jnp.asarray(2.0)))
    np.testing.assert_allclose(both[:, 0], a, rtol=1e-8)
    np.testing.assert_allclose(both[:, 1:], np.where(t >= 2.0, 1.0, 0.0)[:, None] * [7.0, 1.0])
    # from t0 = 3, after both times: the events never fire (initial value true, SBML's
    # rule); with initialValue false they fire at t0, and the jump fires `hit` there
    late = jnp.linspace(3.0, 4.0, 3)
    np.testing.assert_allclose(ds.simulate(model, y0, late, solver=solver).ys[0], y0)
    eager = body.replace('initialValue="true"', 'initialValue="false"', 2)
    eager = ds.sbml.load(_write(tmp_path, eager, "eager.xml"))
    early = ds.simulate(eager, y0, late, solver=solver).ys
    np.testing.assert_allclose(early[:, 1:], [[7.0, 1.0]] * 3)
    np.testing.assert_allclose(early[:, 0], 3.0 * np.exp(-k / 2 * (late - 3.0)), rtol=1e-8)
    # events of one's own come with the model's (a model whose events set no parameter)
    kept = ds.sbml.load(
        _write(
            tmp_path,
            body.replace(
                f'<eventAssignment variable="k">{_MATH.format(halve)}</eventAssignment>', ""
            ),
            "kept.xml",
        )
    )
    assert kept.moved_by_time_events == ()
    stop = ds.Event(lambda t, y: y[0] - 0.1, terminal=True)
    with pytest.raises(ValueError, match=r"\(dose, same, hit\), and events= does not hold them"):
        ds.simulate(kept, y0, ts, solver=solver, events=stop)
    alone = ds.simulate(kept, y0, ts, solver=solver)
    mine = ds.simulate(kept, y0, ts, solver=solver, events=(*kept.events(0.0), stop))
    np.testing.assert_allclose(mine.ys, alone.ys)
    with pytest.raises(ValueError, match=r"set parameters \(k\).*events of your own"):
        ds.simulate(model, y0, ts, solver=solver, events=stop)
    # as the message says: the model with k as a state, and its value appended to y0
    lifted = model.with_states(model.moved_by_time_events)
    assert lifted.state_names == ("A", "B", "h", "k") and "k" not in lifted.params
    start = jnp.append(y0, model.params["k"])
    own = ds.simulate(lifted, start, ts, solver=solver, events=(*lifted.events(0.0), stop))
    np.testing.assert_allclose(own.ys[:, :3], ys, rtol=1e-12)
    np.testing.assert_allclose(own.ys[:, 3], np.where(np.asarray(ts) >= 2.0, k / 2, k))
    # a ds.Problem takes them as its experiments' changes at given times (`model.changes`):
    # at the true k its log-likelihood is the noise terms alone (the data are the closed form
    # without the halving of k, which as a change must be a number or a parameter)
    t = np.asarray(ts)
    a_kept = np.exp(-k * t) + np.where(t >= td, dose * np.exp(-k * (t - td)), 0.0)
    data = {"time": ts, "observable": ["A"] * ts.size, "value": a_kept}
    observables = {"A": ds.Observable(lambda t, y, p: y[0], sigma=0.1)}
    unknowns = {"k": ds.Unknown(0.3, bounds=(0.01, 10.0), scale="log10")}
    study = ds.Problem(kept, [ds.Experiment(data, y0=y0)], observables, unknowns)
    assert study.model.timed_events == () and [c.time for c in study.changes[0]] == [td, 2.0]
    noise_alone = -ts.size * 0.5 * np.log(2 * np.pi * 0.1**2)
    assert study.llh({"k": k}) == pytest.approx(noise_alone, abs=1e-7)
    with pytest.raises(ds.sbml.SBMLError, match=r"event same sets parameter k to 0.5\*k"):
        ds.Problem(model, [ds.Experiment(data, y0=y0)], observables, unknowns)


def _ranked(eid, assignments, priority, at_trigger=True):
    """A time-triggered event at time >= 2 with a priority."""
    event = _event(eid, f"<apply><geq/>{_TIME}<cn>2</cn></apply>", assignments)
    event = event.replace("</trigger>", f"</trigger><priority>{_MATH.format(priority)}</priority>")
    if not at_trigger:
        event = event.replace('useValuesFromTriggerTime="true"', 'useValuesFromTriggerTime="false"')
    return event


def test_time_triggered_events_of_one_instant_act_in_the_order_of_their_priorities(tmp_path):
    """At t = 2, `low` (priority 5, first in the file) sets y = x and `high` (priority 10)
    x = 7: high acts first, then low, which reads x = 7 where its values are those at its
    execution (useValuesFromTriggerTime="false") and the x before both (1) where they are
    those at the trigger; ds.simulate and a ds.Problem's changes alike. Two events of one
    priority that assign one variable are refused (SBML leaves their order open)."""
    species = f"{_species('x', 1.0)}{_species('y', 0.0)}"

    def model(*events, name="m.xml"):
        body = (
            f"<listOfCompartments>{_compartment(size=1.0)}</listOfCompartments>"
            f"<listOfSpecies>{species}</listOfSpecies><listOfEvents>{''.join(events)}"
            "</listOfEvents>"
        )
        return ds.sbml.load(_write(tmp_path, body, name))

    high = _ranked("high", {"x": "<cn>7</cn>"}, "<cn>10</cn>")
    ts = jnp.array([0.0, 1.0, 2.0, 3.0])
    solver = ds.Tsit5(rtol=1e-10, atol=1e-12)
    for at_trigger, y_after in ((False, 7.0), (True, 1.0)):
        low = _ranked("low", {"y": "<ci>x</ci>"}, "<cn>5</cn>", at_trigger)
        ordered = model(low, high, name=f"{at_trigger}.xml")
        assert ordered.structure.timed_order == (1, 0)
        ys = ds.simulate(ordered, ordered.initial_state(), ts, solver=solver).ys
        np.testing.assert_allclose(ys, [[1.0, 0.0], [1.0, 0.0], [7.0, y_after], [7.0, y_after]])
        [(time, changes)] = ordered.changes()
        before = jnp.array([1.0, 0.0])
        assert time == 2.0 and float(changes["y"](before, ordered.params)) == y_after
    tie = model(high, _ranked("again", {"x": "<cn>3</cn>"}, "<cn>10</cn>"), name="tie.xml")
    with pytest.raises(ds.sbml.SBMLError, match="assign x at t = 2.*priorities"):
        tie.changes()
    with pytest.raises(ds.sbml.SBMLError, match="high and again both assign x at t = 2"):
        ds.simulate(tie, tie.initial_state(), ts, solver=solver)
    # a priority on an event triggered by the state is refused
    state = _event("s", "<apply><gt/><ci>x</ci><cn>2</cn></apply>", {"y": "<cn>1</cn>"})
    state = state.replace(
        "</trigger>", f"</trigger><priority>{_MATH.format('<cn>1</cn>')}</priority>"
    )
    with pytest.raises(ds.sbml.SBMLError, match="event s with a priority .its trigger reads"):
        model(state, name="state.xml")


SBML_SUITE = Path(__file__).resolve().parent / "data" / "sbml-test-suite"


@pytest.mark.parametrize("case", sorted(p.name for p in SBML_SUITE.iterdir() if p.is_dir()))
def test_cases_of_the_sbml_test_suite(case):
    """Cases of SBML's own test suite (tests/data/sbml-test-suite/README.md): every reported
    value within the case's criterion |expected - value| <= absolute + relative·|expected|."""
    folder = SBML_SUITE / case
    settings = dict(
        line.split(":", 1)
        for line in (folder / f"{case}-settings.txt").read_text().splitlines()
        if ":" in line
    )
    listed = lambda key: {v.strip() for v in settings[key].split(",") if v.strip()}  # noqa: E731
    start, duration = float(settings["start"]), float(settings["duration"])
    ts = np.linspace(start, start + duration, int(settings["steps"]) + 1)
    model = ds.sbml.load(folder / f"{case}-sbml-l3v2.xml")
    solution = ds.simulate(
        model, model.initial_state(), ts, solver=ds.Rodas5P(rtol=1e-10, atol=1e-12)
    )
    expected = np.genfromtxt(folder / f"{case}-results.csv", delimiter=",", names=True)
    import libsbml

    document = libsbml.readSBMLFromFile(str(folder / f"{case}-sbml-l3v2.xml"))
    for name in sorted(listed("variables")):
        values = np.asarray([model.value(name, t, y) for t, y in zip(ts, solution.ys)])
        species = document.getModel().getSpecies(name)
        if species is not None and not species.getHasOnlySubstanceUnits():
            where = document.getModel().getCompartment(species.getCompartment())
            if where.getSpatialDimensionsAsDouble() != 0 and name in listed("amount"):
                compartment = where.getId()
                values = values * [model.value(compartment, t, y) for t, y in zip(ts, solution.ys)]
        reference = expected[name]
        allowed = float(settings["absolute"]) + float(settings["relative"]) * np.abs(reference)
        assert np.all(np.abs(values - reference) <= allowed), name


def test_initial_assignments_set_parameters_sizes_and_stoichiometries(tmp_path):
    """q = p0 + 1 (the file's value 100 overridden) and the compartment's size c = Vset (4),
    both by initial assignments; A, given as an amount 2 in c, decays at q·A per c: [A] =
    0.5 e^(−q t / c) = 0.5 e^(−t); B → ∅ at kb·B·c with its stoichiometry sr = n = 3 set by
    an initial assignment: B = e^(−n kb t); an assignment rule reads the reaction's rate by
    the reaction's id. New values of p0 and Vset move q, c and [A](0) with them."""
    body = (
        '<listOfCompartments><compartment id="c" size="1" constant="true"/>'
        "</listOfCompartments><listOfSpecies>"
        '<species id="A" compartment="c" initialAmount="2" hasOnlySubstanceUnits="false" '
        'boundaryCondition="false" constant="false"/>'
        + _species("B", 1.0)
        + "</listOfSpecies><listOfParameters>"
        '<parameter id="p0" value="3" constant="true"/>'
        '<parameter id="q" value="100" constant="true"/>'
        '<parameter id="Vset" value="4" constant="true"/>'
        '<parameter id="n" value="3" constant="true"/>'
        '<parameter id="kb" value="0.5" constant="true"/>'
        '<parameter id="flux" constant="false"/></listOfParameters>'
        "<listOfInitialAssignments>"
        '<initialAssignment symbol="q">'
        + _MATH.format("<apply><plus/><ci>p0</ci><cn>1</cn></apply>")
        + '</initialAssignment><initialAssignment symbol="c">'
        + _MATH.format("<ci>Vset</ci>")
        + '</initialAssignment><initialAssignment symbol="sr">'
        + _MATH.format("<ci>n</ci>")
        + "</initialAssignment></listOfInitialAssignments>"
        '<listOfRules><assignmentRule variable="flux">'
        + _MATH.format("<ci>decay</ci>")
        + "</assignmentRule></listOfRules><listOfReactions>"
        '<reaction id="decay" reversible="false"><listOfReactants>'
        '<speciesReference species="A" stoichiometry="1" constant="true"/></listOfReactants>'
        "<kineticLaw>"
        + _MATH.format("<apply><times/><ci>q</ci><ci>A</ci></apply>")
        + '</kineticLaw></reaction><reaction id="loss" reversible="false"><listOfReactants>'
        '<speciesReference id="sr" species="B" stoichiometry="1" constant="true"/>'
        "</listOfReactants><kineticLaw>"
        + _MATH.format("<apply><times/><ci>kb</ci><ci>B</ci><ci>c</ci></apply>")
        + "</kineticLaw></reaction></listOfReactions>"
    )
    model = ds.sbml.load(_write(tmp_path, body))
    assert not {"q", "c"} & set(model.params)  # computed from p0 and Vset
    y0 = model.initial_state()
    np.testing.assert_allclose(y0, [0.5, 1.0])
    assert float(model.value("q", 0.0, y0)) == 4.0 and float(model.value("c", 0.0, y0)) == 4.0
    assert float(model.value("flux", 0.0, y0)) == pytest.approx(4.0 * 0.5)
    ys = _solve(model, y0, TS)
    np.testing.assert_allclose(ys[:, 0], 0.5 * np.exp(-np.asarray(TS)), rtol=1e-9)
    np.testing.assert_allclose(ys[:, 1], np.exp(-1.5 * np.asarray(TS)), rtol=1e-9)
    # p0 = 7 (q = 8), Vset = 2: [A](0) = 1, [A] = e^(−4 t)
    moved = dataclasses.replace(model, params={**model.params, "p0": 7.0, "Vset": 2.0})
    y0 = moved.initial_state()
    np.testing.assert_allclose(y0, [1.0, 1.0])
    # e^(−12) = 6e-6 at t = 3: below the values' scale the solve's atol (1e-12) governs
    np.testing.assert_allclose(
        _solve(moved, y0, TS)[:, 0], np.exp(-4 * np.asarray(TS)), rtol=1e-9, atol=1e-11
    )
    np.testing.assert_allclose(model.initial_state({"Vset": 8.0}), [0.25, 1.0])


def test_an_event_that_resizes_a_compartment_keeps_the_amounts_in_it(tmp_path):
    """A -> at rate k·A (amount per time) in c, which an event doubles at t = 1 (c = 2 -> 4)
    and which also sets B to 5: A's concentration halves there (its amount is kept, SBML's
    rule) and then decays by k / 4 instead of k / 2; B's amount is the value the event gives
    as a concentration in the size before it (SBML's test suite, cases 01779 and 01780), kept
    as the size doubles: B = 5 · 2 / 4 = 2.5. Closed form: A = 3 e^(-k t / 2) before, A(1)/2 ·
    e^(-k (t - 1) / 4) after."""
    k = 0.6
    resize = (
        '<listOfEvents><event id="grow" useValuesFromTriggerTime="false">'
        '<trigger initialValue="true" persistent="true">'
        + _MATH.format(
            '<apply><geq/><csymbol encoding="text" '
            'definitionURL="http://www.sbml.org/sbml/symbols/time">t</csymbol><cn>1</cn></apply>'
        )
        + '</trigger><listOfEventAssignments><eventAssignment variable="c">'
        + _MATH.format("<apply><times/><ci>c</ci><cn>2</cn></apply>")
        + '</eventAssignment><eventAssignment variable="B">'
        + _MATH.format("<cn>5</cn>")
        + "</eventAssignment></listOfEventAssignments></event></listOfEvents>"
    )
    body = (
        f"<listOfCompartments>{_compartment().replace('true', 'false')}</listOfCompartments>"
        f"<listOfSpecies>{_species('A', 3.0)}{_species('B', 1.0)}</listOfSpecies>"
        f'<listOfParameters><parameter id="k" value="{k}" constant="true"/></listOfParameters>'
        + _decay()
        + resize
    )
    model = ds.sbml.load(_write(tmp_path, body))
    assert model.state_names == ("A", "B", "c") and "c" not in model.params
    [(time, assignments)] = model.changes()
    assert time == 1.0 and set(assignments) == {"A", "B", "c"}
    plain = model.without_events()
    y0 = model.initial_state()
    np.testing.assert_allclose(y0, [3.0, 1.0, 2.0])
    before = _solve(plain, y0, jnp.linspace(0.0, 1.0, 5))
    np.testing.assert_allclose(before[:, 0], 3.0 * np.exp(-k * np.linspace(0, 1, 5) / 2), rtol=1e-9)
    y1 = before[-1]
    names = model.state_names
    jumped = y1
    for name, assign in assignments.items():
        jumped = jumped.at[names.index(name)].set(assign(y1, model.params))
    a1 = 3.0 * np.exp(-k / 2)
    np.testing.assert_allclose(jumped, [a1 / 2, 2.5, 4.0], rtol=1e-9)
    after = _solve(plain, jumped, jnp.linspace(1.0, 3.0, 5))
    expected = a1 / 2 * np.exp(-k * (np.linspace(1, 3, 5) - 1) / 4)
    np.testing.assert_allclose(after[:, 0], expected, rtol=1e-9)
    np.testing.assert_allclose(after[:, 1:], np.tile([2.5, 4.0], (5, 1)))
    # a size a rate rule changes is still refused
    by_rule = (
        body.replace(resize, "")
        + '<listOfRules><rateRule variable="c">'
        + _MATH.format("<cn>1</cn>")
        + "</rateRule></listOfRules>"
    )
    with pytest.raises(ds.sbml.SBMLError, match=r"compartment c of variable size \(set by a rate"):
        ds.sbml.load(_write(tmp_path, by_rule, "by_rule.xml"))


def test_initial_values_follow_the_size_the_compartment_is_given(tmp_path):
    """In c of size 2: A given as the amount 1 (in concentration: 1/size), H given as the
    concentration 1.5 but counted in amounts (1.5·size). Another size moves both, and the
    derivative of A(t) = (1/V) e^(−k t / V) with respect to the size V is the closed form's."""
    body = (
        f"<listOfCompartments>{_compartment(size=2.0)}</listOfCompartments><listOfSpecies>"
        + _species("A", 1.0, kind="Amount")
        + _species("H", 1.5, amount=True)
        + '</listOfSpecies><listOfParameters><parameter id="k" value="0.4" constant="true"/>'
        "</listOfParameters>" + _decay()
    )
    model = ds.sbml.load(_write(tmp_path, body))
    np.testing.assert_allclose(model.initial_state(), [0.5, 3.0])
    np.testing.assert_allclose(model.initial_state({"c": 4.0}), [0.25, 6.0])
    t = 1.5

    def a_at(size):
        resized = dataclasses.replace(model, params={**model.params, "c": size})
        ts = jnp.array([0.0, t])
        return ds.simulate(
            resized, resized.initial_state(), ts, solver=ds.Tsit5(rtol=1e-10, atol=1e-12)
        ).ys[-1, 0]

    v, k = 2.0, 0.4
    exact = -np.exp(-k * t / v) / v**2 + np.exp(-k * t / v) / v * (k * t / v**2)
    assert float(jax.grad(a_at)(v)) == pytest.approx(exact, rel=1e-7)


def test_files_that_break_sbml_rules_or_mean_something_else_are_refused(tmp_path):
    """A parameter and a compartment of one id (SBML rule 10301), an id `time` (it would read
    as SBML's time), a call of a function with too few arguments, a compartment of level 3
    without a size, one of negative size; a constant="false" compartment nothing changes
    loads (it is constant)."""
    species = "<listOfSpecies>" + _species("A", 1.0) + "</listOfSpecies>"
    k = '<listOfParameters><parameter id="{}" value="0.4" constant="true"/></listOfParameters>'
    compartments = f"<listOfCompartments>{_compartment()}</listOfCompartments>"
    twice = compartments + species + k.format("c")
    with pytest.raises(ds.sbml.SBMLError, match=r"'c' conflicts .* \(SBML rule 10301\)"):
        ds.sbml.load(_write(tmp_path, twice, "twice.xml"))
    timed = compartments + species + k.format("time") + _decay().replace(">k<", ">time<")
    with pytest.raises(ds.sbml.SBMLError, match="a parameter has the id 'time'.* rename it"):
        ds.sbml.load(_write(tmp_path, timed, "time.xml"))
    function = (
        '<listOfFunctionDefinitions><functionDefinition id="f">'
        + _MATH.format(
            "<lambda><bvar><ci>x</ci></bvar><bvar><ci>y</ci></bvar>"
            "<apply><times/><ci>x</ci><ci>y</ci></apply></lambda>"
        )
        + "</functionDefinition></listOfFunctionDefinitions>"
    )
    called = function + compartments + species + k.format("k")
    called += _decay().replace(
        "<apply><times/><ci>k</ci><ci>A</ci></apply>", "<apply><ci>f</ci><ci>A</ci></apply>"
    )
    path = _write(tmp_path, called, "called.xml")
    with pytest.raises(
        ds.sbml.SBMLError, match="uses the function 'f' which requires a different number of arg"
    ):
        ds.sbml.load(path)
    sizeless = compartments.replace(' size="2.0"', "") + species + k.format("k") + _decay()
    with pytest.raises(ds.sbml.SBMLError, match="compartment c has no size"):
        ds.sbml.load(_write(tmp_path, sizeless, "sizeless.xml"))
    negative = compartments.replace('size="2.0"', 'size="-2"') + species + k.format("k")
    with pytest.raises(ds.sbml.SBMLError, match="compartment c has size -2"):
        ds.sbml.load(_write(tmp_path, negative + _decay(), "negative.xml"))
    unchanged = compartments.replace('constant="true"', 'constant="false"')
    model = ds.sbml.load(_write(tmp_path, unchanged + species + k.format("k") + _decay(), "u.xml"))
    assert float(model.params["c"]) == 2.0
