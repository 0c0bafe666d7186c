"""netdef/registry.py, the one registry type, and the families that use it: each name is declared once,
and every table keyed by a family's names has the names the family registered."""
import sys

import pytest

from netdef.registry import DuplicateNameError, Registry, UnknownNameError


class Alpha:
    pass


class Beta:
    pass


def test_registered_entries_are_found_by_name_and_listed_sorted():
    registry = Registry("test rule")

    @registry.register("beta")
    class B:
        pass

    assert registry.add("alpha", Alpha) is Alpha
    assert registry.get("beta") is B and registry.get("alpha") is Alpha
    assert registry.names() == ["alpha", "beta"]
    assert "alpha" in registry and "gamma" not in registry


def test_entries_given_at_construction():
    registry = Registry("test rule", {"b": Beta, "a": Alpha})
    assert registry.names() == ["a", "b"] and registry.get("b") is Beta


def test_an_unknown_name_lists_the_known_ones():
    registry = Registry("test rule", {"alpha": Alpha, "beta": Beta})
    with pytest.raises(UnknownNameError) as caught:
        registry.get("zzz")
    assert str(caught.value) == "unknown test rule 'zzz' (known rules: alpha, beta)"
    assert isinstance(caught.value, KeyError)
    assert (caught.value.kind, caught.value.name, caught.value.known, caught.value.near) == \
        ("test rule", "zzz", ["alpha", "beta"], [])


def test_a_near_name_is_suggested_whatever_its_case():
    registry = Registry("layer type", {"ReLU": Alpha, "PReLU": Beta, "Convolution": Alpha})
    with pytest.raises(UnknownNameError, match=r"^unknown layer type 'relu' \(did you mean 'ReLU' or 'PReLU'\?\)$"):
        registry.get("relu")
    assert registry.near("Convolutoin") == ["Convolution"]
    assert registry.near("zzz") == []


def test_a_name_taken_by_something_else_is_refused():
    registry = Registry("test rule", {"alpha": Alpha})
    with pytest.raises(DuplicateNameError, match=rf"^test rule 'alpha' is already registered to {__name__}\.Alpha$"):
        registry.add("alpha", Beta)
    assert isinstance(DuplicateNameError("x"), ValueError)
    assert registry.get("alpha") is Alpha


def test_the_same_entry_or_a_redefinition_of_it_may_register_again():
    registry = Registry("test rule", {"alpha": Alpha})
    registry.add("alpha", Alpha)
    again = type("Alpha", (), {})  # the same class from its module run a second time (as __main__)
    registry.add("alpha", again)
    assert registry.get("alpha") is again


def test_unregister_removes_a_name():
    registry = Registry("test rule", {"alpha": Alpha})
    registry.unregister("alpha")
    registry.unregister("never registered")
    assert registry.names() == [] and "alpha" not in registry


def test_load_runs_once_on_the_first_question_and_not_before():
    calls = []
    registry = Registry("test rule", load=lambda: calls.append(registry.add("loaded", Alpha)))
    registry.add("early", Beta)
    assert calls == []
    assert registry.names() == ["early", "loaded"]
    assert registry.get("loaded") is Alpha and "early" in registry
    assert calls == [Alpha]


def test_a_failed_load_is_tried_again():
    attempts = []

    def load():
        attempts.append(1)
        if len(attempts) == 1:
            raise ImportError("first try")

    registry = Registry("test rule", load=load)
    with pytest.raises(ImportError):
        registry.names()
    assert registry.names() == [] and len(attempts) == 2


# ============================================================================================ names listed once
def test_every_built_in_exchange_rule_is_registered_from_one_place():
    from netdef.comm import _builtin, exchange

    modules = {exchange.exchange_class(name).__module__ for name in exchange.registered_exchanges()}
    assert modules == {"netdef.comm.exchange"} | {f"netdef.comm.{m}" for m in ("elastic", "fp16", "gossip", "multicolor")}
    assert {m for m in modules if m != "netdef.comm.exchange"} == \
        {module.__name__ for module in vars(_builtin).values() if isinstance(module, type(sys))}


def test_pycaffe_solver_classes_are_the_update_rules():
    from netdef.solver.solver_types import SOLVER_CLASSES
    from netdef.solver.updates import registered_update_rules, update_rule_class

    assert SOLVER_CLASSES.names() == registered_update_rules()
    for name in SOLVER_CLASSES.names():
        assert SOLVER_CLASSES.get(name).solver_type == name == update_rule_class(name).type_name


def test_every_resolved_progress_mode_has_a_driver():
    from netdef.comm.progress import DRIVERS, MODES, mode_name
    from netdef.proto import netdef_pb2 as pb

    assert MODES == tuple(pb.NetdefDistributedParameter.ProgressMode.keys())
    assert set(DRIVERS.names()) == (set(MODES) - {"AUTO"}) | {"DEFERRED"}
    assert all(mode_name(mode) == mode for mode in MODES)


def test_every_onnx_converter_is_for_a_registered_layer_type():
    pytest.importorskip("onnx")
    from netdef.export.onnx.registry import CONVERTERS
    from netdef.layers.base import registered_types

    assert set(CONVERTERS.names()) <= set(registered_types())
