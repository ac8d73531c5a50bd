"""Info keys: the declaration checked, each row's values taken from the env's info (defaults where it lacks one,
a clear error where it has none), and the columns a packet carries."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from netrl.samples import BufferBuilder
from netrl.samples.info import InfoKey, check_info_keys, info_spec, info_values
from netrl.samples.value_limits import ValueLimits


def test_a_declaration_is_normalised_from_infokeys_tuples_and_dicts() -> None:
    keys = check_info_keys([InfoKey("x"), ("hits", "int64", [2], 0), {"name": "ok", "dtype": "bool",
                                                                       "default": False}], "test")
    assert keys == (InfoKey("x", "float32", (), None), InfoKey("hits", "int64", (2,), 0),
                    InfoKey("ok", "bool", (), False))
    assert info_spec(keys) == {"x": ((), "float32"), "hits": ((2,), "int64"), "ok": ((), "bool")}


@pytest.mark.parametrize(("keys", "message"), [
    ([InfoKey("Distance")], "names an info key 'Distance': use a lowercase identifier"),
    ([InfoKey("x", "str")], "entry 'x' has dtype <U0: the wire carries numbers and bools"),
    ([InfoKey("x", "complex128")], "entry 'x' has dtype complex128"),
    ([InfoKey("x", "float32", (-1,))], r"entry 'x' has shape \(-1,\): at most 8 non-negative ints"),
    ([InfoKey("x", "int8", (), 300)], "entry 'x' has the default 300, which its dtype int8 cannot hold"),
    ([InfoKey("x", "bool", (), 0)], "entry 'x' has the default 0, which its dtype bool cannot hold"),
    ([InfoKey("x"), InfoKey("x", "int64")], "names the info key 'x' twice"),
    ([InfoKey(f"k{i}") for i in range(17)], "declares 17 info keys; at most 16"),
    ([{"name": "x", "dtyp": "bool"}], r"entry \{'name': 'x', 'dtyp': 'bool'\} is not an info key"),
    ("is_success", "must be a list of info keys"),
])
def test_a_bad_declaration_is_refused_naming_the_entry(keys: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_info_keys(keys, "Pipeline.info_keys")


def test_a_missing_key_takes_its_default_or_stops_naming_the_key_and_the_call() -> None:
    keys = check_info_keys([InfoKey("x"), InfoKey("hits", "int64", (), 0)], "test")
    assert info_values(keys, {"x": 1.5, "hits": 3, "other": "kept out"}, "step") == {"x": 1.5, "hits": 3}
    assert info_values(keys, {"x": 2.0}, "reset") == {"x": 2.0, "hits": 0}
    with pytest.raises(ValueError, match=r"the env's reset\(\) returned an info without 'x', an info key the "
                                         r"pipeline declares \(its info holds \['hits'\]\): return it from every "
                                         r"reset\(\), or declare a default, e.g. InfoKey\('x', 'float32', "
                                         r"default=0\)"):
        info_values(keys, {"hits": 1}, "reset")


def builder() -> BufferBuilder:
    b = BufferBuilder(8)
    b.info = info_spec(check_info_keys([InfoKey("x"), InfoKey("hits", "int16", (2,)), InfoKey("ok", "bool")], "t"))
    return b


def test_the_builder_stores_each_rows_info_as_a_column_and_cuts_it_into_the_packet() -> None:
    b = builder()
    b.add(np.float32(0), np.zeros(3, np.float32), 0.0, False, False, True, 0)  # no info: zeros
    for k in range(1, 4):
        b.add(np.float32(k), np.zeros(3, np.float32), 1.0, False, k == 3, False, 0,
              info={"x": k / 2, "hits": [k, -k], "ok": k % 2 == 1})
    buf = b.cut()
    assert buf is not None and buf.info is not None
    assert buf.info["x"].dtype == np.float32 and buf.info["x"].tolist() == [0.0, 0.5, 1.0, 1.5]
    assert buf.info["hits"].dtype == np.int16 and buf.info["hits"].tolist() == [[0, 0], [1, -1], [2, -2], [3, -3]]
    assert buf.info["ok"].tolist() == [False, True, False, True]
    tmrl_info = buf.memory[2][5]  # tmrl's per-row view holds them by name
    assert tmrl_info.keys() == {"x", "hits", "ok", "reset", "weight"} and tmrl_info["x"] == 1.0
    assert tmrl_info["hits"].tolist() == [2, -2] and not tmrl_info["ok"]
    b.add(np.float32(4), np.zeros(3, np.float32), 1.0, False, False, False, 0,
          info={"x": 9.0, "hits": [0, 0], "ok": True})
    nxt = b.cut()
    assert nxt is not None and nxt.info is not None
    assert nxt.info["x"].tolist() == [1.5, 9.0] and nxt.context.tolist() == [True, False]  # the context row's too


@pytest.mark.parametrize(("info", "message"), [
    ({"x": 1.0, "hits": [1, 2, 3], "ok": True}, r"info\['hits'\] is int64 \(3,\) .*declares it int16 \(2,\)"),
    ({"x": 1.0, "hits": [1.5, 2], "ok": True}, r"info\['hits'\] is float64 \(2,\)"),  # numpy would truncate
    ({"x": 1.0, "hits": [70000, 2], "ok": True}, r"info\['hits'\] is int64 \(2,\)"),  # numpy would wrap
    ({"x": 1.0, "hits": [1, 2], "ok": 1}, r"info\['ok'\] is int64 \(\) .*declares it bool"),
    ({"x": "far", "hits": [1, 2], "ok": True}, r"info\['x'\] is <U3 \(\)"),
    ({"x": 1.0, "hits": [1, 2]}, r"a row's info entries \['hits', 'x'\] differ from the info keys declared"),
])
def test_a_value_its_column_cannot_hold_as_it_is_is_refused_naming_the_key(info: dict[str, Any],
                                                                          message: str) -> None:
    b = builder()
    with pytest.raises(ValueError, match=message):
        b.add(np.float32(0), np.zeros(3, np.float32), 0.0, False, False, False, 0, info=info)


def test_the_value_limits_refuse_a_non_finite_info_value_from_the_sample_log_too() -> None:
    b = builder()
    b.add(np.float32(0), np.zeros(3, np.float32), 0.0, False, False, False, 0,
          info={"x": np.inf, "hits": [1, 2], "ok": True})
    buf = b.cut()
    assert buf is not None
    assert ValueLimits().buffer_problem(buf) == "info[x] row 0 is inf: values must be finite"
