"""protocols/jsonrpc.py: the one reading of JSON-RPC 2.0 the bridge has. Examples for each
rule, then properties over any JSON value (peers are untrusted: DESIGN.md rule 4): the
classifier never raises and agrees with the specification written out independently here,
what the encoders write reads back as what was meant, and the pending table behaves as a
plain dictionary of the ids it handed out."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from bridge.protocols import jsonrpc
from bridge.protocols.jsonline import dumps, loads_strict
from bridge.protocols.jsonrpc import Invalid, Notification, Pending, Request, Response, RpcError, classify

FUZZ = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

V = "2.0"


# ---------------------------------------------------------------- examples


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"jsonrpc": V, "id": 1, "method": "m", "params": {"a": 1}}, Request(1, "m", {"a": 1})),
        ({"jsonrpc": V, "id": "x", "method": "m"}, Request("x", "m", None)),
        ({"jsonrpc": V, "id": 0, "method": "m", "params": [1]}, Request(0, "m", [1])),
        ({"jsonrpc": V, "method": "n", "params": {}}, Notification("n", {})),
        ({"jsonrpc": V, "method": "n", "params": 5}, Notification("n", 5)),  # params: the method's business
        ({"jsonrpc": V, "id": 3, "result": None}, Response(3, result=None)),
        ({"jsonrpc": V, "id": "3", "result": {"k": 1}}, Response("3", result={"k": 1})),
    ],
)
def test_well_formed_messages(obj: dict[str, Any], expected: Any) -> None:
    assert classify(obj) == expected


def test_an_error_response_carries_an_rpc_error_and_may_have_a_null_id() -> None:
    got = classify({"jsonrpc": V, "id": None, "error": {"code": -32700, "message": "Parse error"}})
    assert isinstance(got, Response) and got.id is None and got.result is None
    assert got.error is not None and got.error.body() == {"code": -32700, "message": "Parse error"}
    got = classify({"jsonrpc": V, "id": 4, "error": {"code": 7, "message": "m", "data": [1]}})
    assert (
        isinstance(got, Response)
        and got.error is not None
        and got.error.body()
        == {
            "code": 7,
            "message": "m",
            "data": [1],
        }
    )


@pytest.mark.parametrize(
    ("obj", "reason", "answer_id", "reply_to"),
    [
        ([{"jsonrpc": V, "id": 1, "method": "m"}], jsonrpc.BATCH, None, None),
        ([], jsonrpc.BATCH, None, None),
        ("x", jsonrpc.NOT_JSONRPC, None, None),
        (None, jsonrpc.NOT_JSONRPC, None, None),
        ({"id": 10, "method": "initialize"}, jsonrpc.NOT_JSONRPC, 10, None),
        ({"jsonrpc": "1.0", "id": 1, "result": {}}, jsonrpc.NOT_JSONRPC, None, None),
        ({"jsonrpc": 2.0, "id": 1, "method": "m"}, jsonrpc.NOT_JSONRPC, 1, None),
        ({"jsonrpc": V, "id": 2, "method": 5}, jsonrpc.BAD_METHOD, 2, None),
        ({"jsonrpc": V, "method": None}, jsonrpc.BAD_METHOD, None, None),
        ({"jsonrpc": V, "id": True, "method": "m"}, jsonrpc.BAD_REQUEST_ID, None, None),
        ({"jsonrpc": V, "id": 1.0, "method": "m"}, jsonrpc.BAD_REQUEST_ID, None, None),
        ({"jsonrpc": V, "id": None, "method": "m"}, jsonrpc.BAD_REQUEST_ID, None, None),
        ({"jsonrpc": V, "id": [1], "method": "m"}, jsonrpc.BAD_REQUEST_ID, None, None),
        ({"jsonrpc": V}, jsonrpc.NEITHER, None, None),
        ({"jsonrpc": V, "result": 1}, jsonrpc.NEITHER, None, None),
        ({"jsonrpc": V, "id": 1}, jsonrpc.RESULT_XOR_ERROR, None, 1),
        ({"jsonrpc": V, "id": 1, "result": 1, "error": None}, jsonrpc.RESULT_XOR_ERROR, None, 1),
        (
            {"jsonrpc": V, "id": "a", "result": 1, "error": {"code": 1, "message": "m"}},
            jsonrpc.RESULT_XOR_ERROR,
            None,
            "a",
        ),
        ({"jsonrpc": V, "id": None, "result": 1}, jsonrpc.BAD_RESPONSE_ID, None, None),
        ({"jsonrpc": V, "id": False, "result": 1}, jsonrpc.BAD_RESPONSE_ID, None, None),
        ({"jsonrpc": V, "id": 1.5, "error": {"code": 1, "message": "m"}}, jsonrpc.BAD_RESPONSE_ID, None, None),
        ({"jsonrpc": V, "id": 1, "error": "boom"}, jsonrpc.BAD_ERROR, None, 1),
        ({"jsonrpc": V, "id": 1, "error": {"code": True, "message": "m"}}, jsonrpc.BAD_ERROR, None, 1),
        ({"jsonrpc": V, "id": 1, "error": {"code": 1.0, "message": "m"}}, jsonrpc.BAD_ERROR, None, 1),
        ({"jsonrpc": V, "id": 1, "error": {"code": 1}}, jsonrpc.BAD_ERROR, None, 1),
        ({"jsonrpc": V, "id": None, "error": {"message": "m"}}, jsonrpc.BAD_ERROR, None, None),
    ],
)
def test_what_json_rpc_2_rejects_is_invalid_with_its_reason(
    obj: Any, reason: str, answer_id: Any, reply_to: Any
) -> None:
    got = classify(obj)
    response = reason in (jsonrpc.RESULT_XOR_ERROR, jsonrpc.BAD_RESPONSE_ID, jsonrpc.BAD_ERROR)
    assert got == Invalid(reason, answer_id, reply_to, response)
    err = got.error()
    assert err.code == jsonrpc.INVALID_REQUEST and err.message == reason


def test_ids_are_strings_and_integers_and_1_is_not_true_nor_the_string_1() -> None:
    for good in (0, -1, 2**70, "", "1", "x"):
        assert jsonrpc.is_id(good)
    for bad in (True, False, None, 1.0, [1], {"a": 1}):
        assert not jsonrpc.is_id(bad)
    assert jsonrpc.id_key(1) != jsonrpc.id_key("1")


def test_one_constructor_per_code() -> None:
    made = {
        RpcError.parse_error(): jsonrpc.PARSE_ERROR,
        RpcError.invalid_request("r"): jsonrpc.INVALID_REQUEST,
        RpcError.method_not_found(): jsonrpc.METHOD_NOT_FOUND,
        RpcError.invalid_params("p"): jsonrpc.INVALID_PARAMS,
        RpcError.internal("i"): jsonrpc.INTERNAL_ERROR,
        RpcError.auth_required("a"): jsonrpc.AUTH_REQUIRED,
        RpcError.too_many("t"): jsonrpc.TOO_MANY,
        RpcError.access_denied("d"): jsonrpc.ACCESS_DENIED,
        RpcError.not_found("n"): jsonrpc.RESOURCE_NOT_FOUND,
        RpcError.cancelled(): jsonrpc.REQUEST_CANCELLED,
    }
    for err, code in made.items():
        assert err.code == code and isinstance(err.message, str) and err.message
    assert (jsonrpc.PARSE_ERROR, jsonrpc.INVALID_REQUEST, jsonrpc.METHOD_NOT_FOUND) == (-32700, -32600, -32601)
    assert (jsonrpc.INVALID_PARAMS, jsonrpc.INTERNAL_ERROR, jsonrpc.REQUEST_CANCELLED) == (-32602, -32603, -32800)
    assert (jsonrpc.AUTH_REQUIRED, jsonrpc.ACCESS_DENIED, jsonrpc.RESOURCE_NOT_FOUND) == (-32000, -32001, -32002)
    assert RpcError.parse_error().body() == {"code": -32700, "message": "Parse error"}
    assert RpcError.invalid_params("p", {"code": "x"}).body() == {"code": -32602, "message": "p", "data": {"code": "x"}}


def test_the_envelopes() -> None:
    assert jsonrpc.request(1, "m", {}) == {"jsonrpc": V, "id": 1, "method": "m", "params": {}}
    assert jsonrpc.notification("n", {"a": 1}) == {"jsonrpc": V, "method": "n", "params": {"a": 1}}
    assert jsonrpc.result("x", None) == {"jsonrpc": V, "id": "x", "result": None}
    assert jsonrpc.error(None, RpcError.parse_error()) == {
        "jsonrpc": V,
        "id": None,
        "error": {"code": -32700, "message": "Parse error"},
    }


def test_pending_ids_count_up_and_an_answer_settles_exactly_its_request() -> None:
    table: Pending[str] = Pending()
    assert [table.add("a"), table.add("b")] == [0, 1]
    assert table.take("0") is None and table.take(True) is None and table.take(1.0) is None
    assert 1 in table and True not in table and len(table) == 2
    assert table.take(1) == "b" and table.take(1) is None
    table.drop(0)
    assert len(table) == 0 and table.take(0) is None
    prefixed: Pending[int] = Pending(first=1, prefix="relay-")
    assert prefixed.add(7) == "relay-1" and prefixed.add(8) == "relay-2"
    assert sorted(prefixed.contexts()) == [7, 8]
    assert sorted(prefixed.fail_all()) == [("relay-1", 7), ("relay-2", 8)] and len(prefixed) == 0
    assert prefixed.add(9) == "relay-3"  # ids are never reused


# ---------------------------------------------------------------- properties

json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10,
)
ids = st.integers() | st.text(max_size=8)
any_ids = ids | json_scalars | st.just([1]) | st.just({"a": 1})
KEYS = ("jsonrpc", "id", "method", "params", "result", "error")
fields = {
    "jsonrpc": st.just(V) | st.sampled_from(["1.0", "2", 2.0, None]),
    "id": any_ids,
    "method": st.text(max_size=8) | json_scalars,
    "params": json_values,
    "result": json_values,
    "error": st.fixed_dictionaries(
        {},
        optional={
            "code": st.integers() | json_scalars,
            "message": st.text(max_size=8) | json_scalars,
            "data": json_values,
        },
    )
    | json_values,
}
# Objects with any subset of the members JSON-RPC names (mostly well-typed), plus others.
messages = st.fixed_dictionaries({}, optional=fields).flatmap(
    lambda d: st.dictionaries(st.text(max_size=4), json_values, max_size=2).map(lambda extra: {**extra, **d})
)


def spec_kind(obj: Any) -> str:
    """JSON-RPC 2.0 §4-5, written out a second time and independently of the module: which
    of request, notification, response, error or invalid a value is."""
    if type(obj) is not dict or obj.get("jsonrpc") != "2.0":
        return "invalid"

    def an_id(v: Any) -> bool:
        return type(v) is str or type(v) is int

    if "method" in obj:
        if type(obj["method"]) is not str:
            return "invalid"
        if "id" not in obj:
            return "notification"
        return "request" if an_id(obj["id"]) else "invalid"
    if "id" not in obj or ("result" in obj) == ("error" in obj):
        return "invalid"
    if "result" in obj:
        return "response" if an_id(obj["id"]) else "invalid"
    err = obj["error"]
    well_formed = type(err) is dict and type(err.get("code")) is int and type(err.get("message")) is str
    return "error" if well_formed and (an_id(obj["id"]) or obj["id"] is None) else "invalid"


def kind_of(msg: jsonrpc.Message) -> str:
    if isinstance(msg, Response):
        return "response" if msg.error is None else "error"
    return {Request: "request", Notification: "notification", Invalid: "invalid"}[type(msg)]


@FUZZ
@given(messages | json_values)
def test_classify_never_raises_and_agrees_with_the_specification(obj: Any) -> None:
    msg = classify(obj)
    assert kind_of(msg) == spec_kind(obj), (obj, msg)
    if isinstance(msg, Invalid):
        assert msg.reason and msg.error().code == jsonrpc.INVALID_REQUEST
        assert msg.answer_id is None or (jsonrpc.is_id(msg.answer_id) and "method" in obj)
        assert msg.reply_to is None or (jsonrpc.is_id(msg.reply_to) and msg.response)
        assert not msg.response or ("method" not in obj and "id" in obj and msg.answer_id is None)
        dumps(jsonrpc.error(msg.answer_id, msg.error()))
    if isinstance(msg, Request | Response) and msg.id is not None:
        assert jsonrpc.is_id(msg.id) and msg.id == obj["id"] and type(msg.id) is type(obj["id"])


def _wire(message: dict[str, Any]) -> Any:
    """What the peer reads: the message through the bridge's writer and strict reader."""
    text = dumps(message)
    assert "\n" not in text
    return loads_strict(text)


@FUZZ
@given(ids, st.text(max_size=10), json_values, json_values)
def test_what_the_encoders_write_reads_back_as_what_was_meant(rid: Any, method: str, params: Any, value: Any) -> None:
    assert classify(_wire(jsonrpc.request(rid, method, params))) == Request(rid, method, params)
    assert classify(_wire(jsonrpc.notification(method, params))) == Notification(method, params)
    assert classify(_wire(jsonrpc.result(rid, value))) == Response(rid, result=value)


@FUZZ
@given(ids | st.none(), st.integers(), st.text(max_size=10), json_values)
def test_errors_read_back_with_their_code_message_and_data(rid: Any, code: int, message: str, data: Any) -> None:
    got = classify(_wire(jsonrpc.error(rid, RpcError(code, message, data))))
    assert isinstance(got, Response) and got.id == rid and got.error is not None
    assert (got.error.code, got.error.message, got.error.data) == (code, message, data)


class PendingTable(RuleBasedStateMachine):
    """The pending table against a plain dictionary of the ids it handed out."""

    issued = Bundle("issued")

    def __init__(self) -> None:
        super().__init__()
        self.table: Pending[int] = Pending()
        self.model: dict[Any, int] = {}
        self.seen: set[Any] = set()
        self.n = 0

    @rule(target=issued)
    def add(self) -> Any:
        self.n += 1
        rid = self.table.add(self.n)
        assert rid not in self.seen  # never two requests on one id
        self.seen.add(rid)
        self.model[rid] = self.n
        return rid

    @rule(rid=issued)
    def take(self, rid: Any) -> None:
        assert self.table.take(rid) == self.model.pop(rid, None)

    @rule(rid=issued)
    def take_as_another_type(self, rid: Any) -> None:
        for other in (str(rid), float(rid), rid == 1):
            assert self.table.take(other) is None

    @rule(rid=issued)
    def drop(self, rid: Any) -> None:
        self.table.drop(rid)
        self.model.pop(rid, None)

    @rule(value=json_values)
    def take_anything(self, value: Any) -> None:
        expected = self.model.pop(value, None) if type(value) is int else None
        assert self.table.take(value) == expected

    @rule()
    def fail_all(self) -> None:
        assert sorted(self.table.fail_all()) == sorted(self.model.items())
        self.model.clear()

    @invariant()
    def same_as_the_model(self) -> None:
        assert len(self.table) == len(self.model)
        assert sorted(self.table.contexts()) == sorted(self.model.values())


TestPendingTable = PendingTable.TestCase
TestPendingTable.settings = settings(max_examples=80, stateful_step_count=30, deadline=None, database=None)
