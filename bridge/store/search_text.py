"""Full-text search over transcripts (docs/api.md "Search"), the part both stores share.
PURE: no database driver, no asyncio (the SQLite writer process imports it).

What is indexed is a *document*: the searchable text of one event, at most
``MAX_DOC_TEXT`` characters, with the event's seq, time and kind:

* a ``message`` (the client's prompt, the agent's complete message; not stream-json's
  echo of the prompt, ``origin: "replay"``, which would only repeat the prompt);
* a ``tool.call``'s name, title and input; a ``tool.result``'s output (JSON as text);
* a streamed message: an agent's consecutive ``message.delta`` events of one channel are
  joined into one document at the seq of the first (so a phrase that crosses two deltas
  is found, and one answer is one hit, not one per chunk). The stream being joined is
  kept beside the index (a row per thread, in the same transaction as the events) and
  becomes a document when something else of the conversation follows it; when that is
  the agent's complete message (stream-json sends one after its deltas), the stream is
  dropped instead: the message says the same. So an answer is searchable from the
  commit of the event after it (at the latest its turn's end), never lost by a crash.

Everything else (status lines, stream structure, usage, process life) is not indexed.

The query: web-search syntax, the same on both stores (PostgreSQL's
``websearch_to_tsquery``): words (all must appear), ``"a phrase"``, ``or`` between two
terms, ``-word`` / ``-"phrase"`` to exclude. A term is matched as whole words, case
ignored. The user's text never becomes query syntax: on SQLite each word and phrase is a
quoted FTS5 string (:func:`fts5_query`); on PostgreSQL the text is a bound parameter of
``websearch_to_tsquery``, which never fails. A query with nothing to look for (only
punctuation, or only exclusions) is refused (:class:`~bridge.errors.InvalidRequest`).
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from bridge.errors import InvalidRequest

MAX_DOC_TEXT = 8 * 1024  # characters of one document (the rest of the event is not indexed)
MAX_QUERY = 1000  # characters of a query
MAX_TERMS = 32  # words and phrases of a query
SNIPPET_TOKENS = 24  # about this many words around the match
# The snippet's match markers as the databases write them: private-use characters, taken
# out of the indexed text, then turned into ``marks`` (so no markup reaches a client).
MARK_START = "\ue000"
MARK_END = "\ue001"

STREAM_KIND = "message.delta"
# What ends a stream of deltas (it becomes a document, or is dropped for a complete
# message): the conversation's other items. Status lines and stream structure do not.
_CLOSERS = frozenset(
    {"message", "tool.call", "tool.result", "permission.requested", "turn.started", "turn.ended", "process.exited"}
)
_INDEXED = frozenset({"message", "tool.call", "tool.result"})
# The kinds an append must hold for the index to look at it at all.
RELEVANT = _CLOSERS | {STREAM_KIND}


@dataclass(frozen=True, slots=True)
class Doc:
    seq: int
    ts: str
    kind: str
    text: str


@dataclass(slots=True)
class Stream:
    """A thread's deltas being joined: the first one's seq and time, the channel, the text."""

    seq: int
    ts: str
    channel: str
    text: str


def _clean(text: str) -> str:
    """Bounded, without the snippet markers (they would be taken for a match), NULs
    (PostgreSQL text cannot hold one) or lone surrogates (JSON may escape one; no database
    can store it): an event the transcript takes is never refused for its index."""
    text = text[:MAX_DOC_TEXT]
    if MARK_START in text or MARK_END in text or "\x00" in text:
        text = text.replace(MARK_START, " ").replace(MARK_END, " ").replace("\x00", " ")
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode(errors="replace").decode()
    return text


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)[: MAX_DOC_TEXT * 2]


def event_text(kind: str, source: str, data: dict[str, Any]) -> str:
    """The searchable text of a (non-delta) event, '' for none."""
    if kind == "message":
        if data.get("origin") == "replay":
            return ""
        return _as_text(data.get("text"))
    if kind == "tool.call":
        parts = [_as_text(data.get(k)) for k in ("name", "title", "input")]
        return "\n".join(p for p in parts if p)
    if kind == "tool.result":
        return _as_text(data.get("output"))
    return ""


def _data(data_json: str) -> dict[str, Any]:
    try:
        data = orjson.loads(data_json)
    except ValueError:  # orjson.JSONDecodeError is one; it refuses a lone surrogate's escape
        try:
            data = json.loads(data_json)
        except ValueError:
            return {}
    return data if isinstance(data, dict) else {}


def index_plan(
    stream: Stream | None, rows: Iterable[tuple[int, str, str, str, str]]
) -> tuple[list[Doc], Stream | None]:
    """The documents an append's rows ``(seq, ts, source, kind, data_json)`` make, given
    the thread's open stream, and the stream left open after them."""
    docs: list[Doc] = []
    for seq, ts, source, kind, data_json in rows:
        if kind not in RELEVANT:
            continue
        data = _data(data_json)
        if kind == STREAM_KIND:
            stream = _delta(stream, docs, seq, ts, source, data)
            continue
        if stream is not None:
            # The agent's complete message replaces the stream it was made of.
            if not (kind == "message" and source == "agent"):
                docs.append(_stream_doc(stream))
            stream = None
        if kind in _INDEXED:
            text = _clean(event_text(kind, source, data))
            if text.strip():
                docs.append(Doc(seq, ts, kind, text))
    return docs, stream


def _delta(
    stream: Stream | None, docs: list[Doc], seq: int, ts: str, source: str, data: dict[str, Any]
) -> Stream | None:
    text = data.get("text")
    if source != "agent" or not isinstance(text, str) or not text:
        return stream
    channel = data.get("channel") if isinstance(data.get("channel"), str) else "text"
    if stream is not None and (stream.channel != channel or len(stream.text) >= MAX_DOC_TEXT):
        docs.append(_stream_doc(stream))  # another channel, or a full document: a new one
        stream = None
    if stream is None:
        return Stream(seq, ts, str(channel), _clean(text))
    stream.text = _clean(stream.text + text)
    return stream


def _stream_doc(stream: Stream) -> Doc:
    return Doc(stream.seq, stream.ts, STREAM_KIND, stream.text)


def joined_deltas(sources: list[str], kinds: list[str], datas: list[str]) -> tuple[str, str] | None:
    """For an append of nothing but the agent's deltas of one channel, with text: that
    channel and their text joined (bounded); None for any other append."""
    if any(k != STREAM_KIND for k in kinds) or any(s != "agent" for s in sources):
        return None
    channel: Any = None
    texts: list[str] = []
    for data_json in datas:
        data = _data(data_json)
        text, ch = data.get("text"), data.get("channel") if isinstance(data.get("channel"), str) else "text"
        if not isinstance(text, str) or not text or (channel is not None and ch != channel):
            return None
        channel = ch
        texts.append(text)
    return str(channel), _clean("".join(texts))


class Backfill:
    """The documents of a store's existing events, for the migration that makes the index,
    exactly as the appends would have made them. Fed ``(thread_id, seq, ts, source, kind,
    data_json)`` rows of the relevant kinds, by thread then seq, in chunks of any size;
    ``finish`` gives the streams the threads' transcripts end in."""

    def __init__(self) -> None:
        self._thread: str | None = None
        self._stream: Stream | None = None
        self._streams: list[tuple[str, Stream]] = []

    def feed(self, rows: Iterable[tuple[str, int, str, str, str, str]]) -> list[tuple[str, Doc]]:
        out: list[tuple[str, Doc]] = []
        for thread_id, group in itertools.groupby(rows, key=lambda r: r[0]):
            if thread_id != self._thread:
                self._close()
                self._thread = thread_id
            docs, self._stream = index_plan(self._stream, (r[1:] for r in group))
            out += [(thread_id, d) for d in docs]
        return out

    def _close(self) -> None:
        if self._thread is not None and self._stream is not None:
            self._streams.append((self._thread, self._stream))
        self._stream = None

    def finish(self) -> list[tuple[str, Stream]]:
        self._close()
        return self._streams


def relevant(kinds: Iterable[str]) -> bool:
    """Whether an append with events of these kinds can change the index."""
    return not RELEVANT.isdisjoint(kinds)


# ---------------------------------------------------------------------- the query

_TERM = re.compile(r'(-?)"([^"]*)"?|(\S+)')


@dataclass(frozen=True, slots=True)
class Term:
    text: str
    negated: bool


def _term(m: re.Match[str]) -> Term | None:
    """One word or phrase of the query; None for one with nothing to look for."""
    neg, phrase, word = m.group(1), m.group(2), m.group(3)
    if word is not None and word.startswith("-") and len(word) > 1:
        neg, word = "-", word[1:]
    text = phrase if phrase is not None else word or ""
    if not any(c.isalnum() for c in text):
        return None
    return Term(" ".join(text.split()), bool(neg))


def parse_query(q: str) -> list[list[Term]]:
    """The query as AND of OR-groups of terms (web-search syntax, see the module).
    InvalidRequest (``invalid_query``) when it is too long or has nothing to look for."""
    if len(q) > MAX_QUERY:
        raise InvalidRequest(f"q is longer than {MAX_QUERY} characters", code="invalid_query")
    groups: list[list[Term]] = []
    join_next = False
    for m in _TERM.finditer(q):
        if m.group(3) is not None and m.group(3).lower() == "or" and groups:
            join_next = True
            continue
        term = _term(m)
        if term is None:
            continue
        if join_next and not term.negated and not groups[-1][-1].negated:
            groups[-1].append(term)
        else:
            groups.append([term])
        join_next = False
    if not any(not g[0].negated for g in groups):
        raise InvalidRequest("q has no word to look for", code="invalid_query")
    if sum(map(len, groups)) > MAX_TERMS:
        raise InvalidRequest(f"q has more than {MAX_TERMS} words and phrases", code="invalid_query")
    return groups


_SEPARATORS = re.compile(r"[\W_]+")


def words(text: str) -> str:
    """Text as FTS5's tokenizer sees it (``unicode61 remove_diacritics 2``): letters and
    digits, accents taken off, everything else a separator. PostgreSQL's index and query
    are made of this (so both stores agree on what a word is)."""
    decomposed = unicodedata.normalize("NFKD", text)
    return _SEPARATORS.sub(" ", "".join(c for c in decomposed if not unicodedata.combining(c))).strip()


def tsquery_sql(groups: list[list[Term]]) -> tuple[str, list[str]]:
    """The parsed query as a PostgreSQL tsquery expression of ``phraseto_tsquery`` calls
    joined by the tsquery operators, with each term's words as a bound parameter."""
    params: list[str] = []

    def phrase(t: Term) -> str:
        params.append(words(t.text))
        return "phraseto_tsquery('simple', %s)"

    wanted = [g for g in groups if not g[0].negated]
    excluded = [g[0] for g in groups if g[0].negated]
    parts = ["(" + " || ".join(phrase(t) for t in g) + ")" for g in wanted]
    parts += [f"!!{phrase(t)}" for t in excluded]
    return " && ".join(parts), params


def _fts5_string(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def fts5_query(groups: list[list[Term]]) -> str:
    """The parsed query as an FTS5 expression in which every term is a quoted string, so
    nothing the user wrote is FTS5 syntax."""
    wanted = [g for g in groups if not g[0].negated]
    excluded = [g[0] for g in groups if g[0].negated]
    expr = " AND ".join("(" + " OR ".join(_fts5_string(t.text) for t in g) + ")" for g in wanted)
    for t in excluded:
        expr = f"({expr}) NOT {_fts5_string(t.text)}"
    return expr


# ---------------------------------------------------------------------- hits and cursors


def marked(snippet: str) -> tuple[str, list[list[int]]]:
    """A snippet as the database marked it: its plain text and the matches in it as
    ``[start, length]`` in characters (code points)."""
    out: list[str] = []
    marks: list[list[int]] = []
    at = 0
    start: int | None = None
    for ch in snippet:
        if ch == MARK_START:
            start = at
        elif ch == MARK_END:
            if start is not None and at > start:
                marks.append([start, at - start])
            start = None
        else:
            out.append(ch)
            at += 1
    return "".join(out), marks


def hit(thread_id: str, seq: int, kind: str, ts: str, snippet: str | None) -> dict[str, Any]:
    text, marks = marked(snippet or "")
    return {"thread": thread_id, "seq": int(seq), "kind": kind, "ts": ts, "snippet": text, "marks": marks}


def encode_cursor(doc_id: int) -> str:
    return base64.urlsafe_b64encode(json.dumps(["s", int(doc_id)]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int | None:
    """The document id a page continues below (None: from the newest)."""
    if not cursor:
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if isinstance(value, list) and len(value) == 2 and value[0] == "s" and type(value[1]) is int:
            return int(value[1])
    except (ValueError, UnicodeDecodeError):
        pass
    raise InvalidRequest("cursor is not valid", code="invalid_cursor")
