"""sessions/delta_scrub.py: a secret streamed across deltas is redacted whole in the text
the deltas carry, whatever the split, and nothing else changes but the timing."""

from __future__ import annotations

import json

from bridge.protocols.events import REDACTED, Event
from bridge.sessions.delta_scrub import DeltaScrub
from bridge.sessions.scrub import Scrubber

SECRET = "sk-test-0123456789abcdef"
OTHER = "hunter2-hunter2"


def delta(text: str, channel: str = "text") -> Event:
    return Event("agent", "message.delta", {"text": text, "channel": channel}, raw="{}", relay=True)


def texts(events: list[Event], channel: str = "text") -> str:
    return "".join(e.data["text"] for e in events if e.kind == "message.delta" and e.data["channel"] == channel)


def stream(ds: DeltaScrub, parts: list[str], scrub: Scrubber) -> list[Event]:
    out: list[Event] = []
    for part in parts:
        out += ds.events([delta(scrub.text(part))])  # (each line is scrubbed on its own first)
        # no text let out ever ends in the start of a secret
        assert not any(SECRET.startswith(t[i:]) for t in (texts(out),) for i in range(len(t)) if t[i:])
    return out + ds.events([Event("agent", "message", {"text": "done"})])


def test_a_secret_split_at_every_position_is_redacted_whole() -> None:
    text = f"the key is {SECRET}, keep it"
    start = text.index(SECRET)
    for cut in range(start, start + len(SECRET) + 1):
        scrub = Scrubber({"API_KEY": SECRET})
        out = stream(DeltaScrub(scrub), [text[:cut], text[cut:]], scrub)
        assert texts(out) == f"the key is {REDACTED}, keep it", cut
        assert out[-1].kind == "message"  # what was held came before the next event


def test_a_secret_in_three_pieces_and_two_secrets_back_to_back() -> None:
    scrub = Scrubber({"API_KEY": SECRET, "PASSWORD": OTHER})
    out = stream(DeltaScrub(scrub), ["a sk-t", "est-0123", "456789ab", f"cdef{OTHER[:4]}", OTHER[4:], " end"], scrub)
    assert texts(out) == f"a {REDACTED}{REDACTED} end"
    assert SECRET not in texts(out) and OTHER not in texts(out)


def test_a_prefix_that_is_no_secret_comes_out_unchanged() -> None:
    ds = DeltaScrub(Scrubber({"API_KEY": SECRET}))
    first = ds.events([delta("asks")])
    assert texts(first) == "ask"  # "s" might begin the secret
    second = ds.events([delta("k-other")])
    assert texts(second) == "sk-other"
    assert texts(ds.events([delta("ends in sk-te")])) == "ends in "
    end = ds.events([Event("agent", "turn.ended", {})])  # the stream is over: given back
    assert texts(end) == "sk-te" and end[-1].kind == "turn.ended"
    assert ds.flush() == []


def test_the_longest_possible_start_is_held_whichever_secret_it_begins() -> None:
    for env in ({"A_TOKEN": "abcdef12", "B_TOKEN": "cdefgh34"}, {"B_TOKEN": "cdefgh34", "A_TOKEN": "abcdef12"}):
        ds = DeltaScrub(Scrubber(env))
        assert ds.hold_at("x abcdef") == 2 and ds.hold_at("x cdef") == 2 and ds.hold_at("x ab") == 2
        assert ds.hold_at("x a") == 2 and ds.hold_at("x abcdef12") == 10 and ds.hold_at("x") == 1
        assert (
            ds.hold_at("") == 0 and ds.hold_at("c") == 0 and ds.hold_at("abcdefx") == 7 and ds.hold_at("abcdefg") == 2
        )


def test_held_text_is_given_back_at_the_end_and_keeps_the_deltas_fields() -> None:
    ds = DeltaScrub(Scrubber({"API_KEY": SECRET}))
    ev = Event("agent", "message.delta", {"text": "x sk-", "channel": "thought", "messageId": "m1"})
    assert ds.events([ev])[0].data == {"text": "x ", "channel": "thought", "messageId": "m1"}
    assert [(e.source, e.kind, e.data, e.raw, e.relay) for e in ds.flush()] == [
        ("agent", "message.delta", {"text": "sk-", "channel": "thought", "messageId": "m1"}, None, False)
    ]


def test_channels_are_held_apart() -> None:
    ds = DeltaScrub(Scrubber({"API_KEY": SECRET}))
    out = ds.events([delta("a sk-test", "text"), delta("thinking sk", "thought"), delta("-0123456789abcdef")])
    out += ds.events([delta("-test-0123456789abcdef", "thought")]) + ds.flush()
    assert texts(out, "text") == f"a {REDACTED}"
    assert texts(out, "thought") == f"thinking {REDACTED}"


def test_the_json_escaped_form_is_held_too() -> None:
    secret = 'pa"ss\\word-1'
    escaped = json.dumps(secret)[1:-1]
    ds = DeltaScrub(Scrubber({"PASSWORD": secret}))
    for value in (secret, escaped):
        for cut in range(1, len(value)):
            out = ds.events([delta("q " + value[:cut])]) + ds.events([delta(value[cut:] + " z")]) + ds.flush()
            assert texts(out) == f"q {REDACTED} z", (value, cut)


def test_the_raw_line_and_relay_stay_with_their_event() -> None:
    ds = DeltaScrub(Scrubber({"API_KEY": SECRET}))
    out = ds.events([delta("sk-test"), delta("-0123456789abcdef!")])
    assert [(e.data["text"], e.raw, e.relay) for e in out] == [("", "{}", True), (f"{REDACTED}!", "{}", True)]


def test_no_secret_no_change() -> None:
    ds = DeltaScrub(Scrubber({"HOME": "/home/someone"}))
    assert not ds.active
    ev = delta("sk-")
    assert ds.events([ev]) == [ev] and ds.events([ev])[0] is ev
    short = DeltaScrub(Scrubber({"API_KEY": "abc"}))  # too short to redact: nothing held either
    assert not short.active
