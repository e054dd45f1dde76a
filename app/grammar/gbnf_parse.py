"""GBNF, parsed the way llama.cpp parses it, counting what its parser would build.

llama.cpp's GBNF parser recurses once per nested group and once per rule in a leftmost chain,
with no limit (a deep grammar overflows the C stack and kills the process), expands
``x{0,2000}`` into 2000 rules with no global budget (memory), and costs O(stacks x vocabulary)
per sampled token (time). So this parser follows llama.cpp's grammar in Python, without
recursion, and stops at the first bound crossed (:class:`OverLimit`) or the first syntax error
llama.cpp would refuse (:class:`Malformed`). It knows nothing of requests: the gate
(:mod:`app.grammar.gate`) turns its verdict into a 400 and caches it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from app.base.bridge import original_sleep

# llama.cpp's own cap on the rules one repetition may create (MAX_REPETITION_THRESHOLD).
LLAMA_REPETITION_THRESHOLD = 2000


class Bounds(Protocol):
    """The bounds the parse enforces as it goes (``app.grammar.gate.Limits`` is one)."""

    @property
    def max_rules(self) -> int: ...
    @property
    def max_symbols(self) -> int: ...
    @property
    def max_depth(self) -> int: ...
    @property
    def max_repetition(self) -> int: ...
    @property
    def max_alternatives(self) -> int: ...
    @property
    def max_optionals(self) -> int: ...


@dataclass(frozen=True)
class Stats:
    """What a grammar costs llama.cpp's parser (counted as it expands the grammar)."""

    rules: int
    symbols: int
    depth: int
    alternatives: int
    optionals: int
    repetition: int
    has_tokens: bool  # <[id]> / <text> token items (the engine's byte prefilter cannot apply)


_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_HEX = {"x": 2, "u": 4, "U": 8}
_SIMPLE_ESCAPES = frozenset('trn\\"[]-')


class Malformed(Exception):
    """A grammar llama.cpp's parser would refuse; the message says where and why."""


class OverLimit(Exception):
    """A limit crossed while parsing: the message and the setting that sets the limit."""

    def __init__(self, message: str, setting: str):
        super().__init__(message)
        self.setting = setting


class _Frame:
    """One alternates (a rule's body or a group) being parsed."""

    __slots__ = (
        "nested", "alts", "size", "last_start", "n_prev_rules", "run", "optional",
        "generated_before", "rule", "items",
    )

    def __init__(self, nested: bool, rule: str, generated_before: int = 0) -> None:
        self.nested = nested
        self.rule = rule
        self.alts = 1
        self.generated_before = generated_before  # rules generated before this group opened
        # the current alternative: [ref (None: a terminal), optional, unbounded, span] per item
        self.items: list[list[Any]] = []
        self.new_sequence()

    def new_sequence(self) -> None:
        self.size = 0  # symbols in the current sequence
        self.last_start = -1  # where the last item starts (-1: no item yet)
        self.n_prev_rules = 1  # rules the last item stands for (llama.cpp's repetition check)
        self.run = 0  # optional items in a row, up to the last one
        self.optional = False  # whether the last item is optional


class _Parser:
    """Walks GBNF with llama.cpp's grammar and counts what its parser would build."""

    def __init__(self, text: str, limits: Bounds):
        self.s = text
        self.n = len(text)
        self.limits = limits
        self.names: set[str] = set()
        self.defined: set[str] = set()
        self.generated = 0
        self.symbols = 0
        self.depth = 1
        self.alternatives = 1
        self.optionals = 0
        self.repetition = 0
        self.has_tokens = False
        self.fanout = 1
        self.run_through = 0
        self.steps = 0
        # rule -> its alternatives, each a list of items [ref (None: a terminal), optional,
        # unbounded, span (how many copies in a row it expands to)]
        self.structure: dict[str, list[list[list[Any]]]] = {}

    # -- lexing, as llama-grammar.cpp does it
    def space(self, pos: int, newline_ok: bool) -> int:
        s, n = self.s, self.n
        while pos < n:
            c = s[pos]
            if c == "#":
                while pos < n and s[pos] not in "\r\n":
                    pos += 1
            elif c in " \t" or (newline_ok and c in "\r\n"):
                pos += 1
            else:
                break
        return pos

    def name(self, pos: int) -> int:
        end = pos
        while end < self.n and self.s[end] in _WORD:
            end += 1
        if end == pos:
            raise Malformed(f"expecting a rule name at offset {pos}")
        return end

    def integer(self, pos: int) -> tuple[int, int]:
        end = pos
        while end < self.n and "0" <= self.s[end] <= "9":
            end += 1
        if end == pos:
            raise Malformed(f"expecting an integer at offset {pos}")
        if end - pos > 9:
            raise OverLimit(f"a repetition bound of {end - pos} digits", "GRAMMAR_MAX_REPETITION")
        return int(self.s[pos:end]), end

    def char(self, pos: int) -> int:
        """Position after one (possibly escaped) character."""
        s = self.s
        if pos >= self.n:
            raise Malformed("unexpected end of grammar")
        if s[pos] != "\\":
            return pos + 1
        esc = s[pos + 1] if pos + 1 < self.n else ""
        if esc in _HEX:
            digits = s[pos + 2 : pos + 2 + _HEX[esc]]
            if len(digits) != _HEX[esc] or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise Malformed(f"expecting {_HEX[esc]} hex digits at offset {pos + 2}")
            return pos + 2 + _HEX[esc]
        if esc and esc in _SIMPLE_ESCAPES:
            return pos + 2
        raise Malformed(f"unknown escape at offset {pos}")

    # -- the grammar
    def parse(self) -> None:
        pos = self.space(0, True)
        while pos < self.n:
            end = self.name(pos)
            rule = self.s[pos:end]
            self.names.add(rule)
            self.defined.add(rule)
            pos = self.space(end, False)
            if self.s[pos : pos + 3] != "::=":
                raise Malformed(f"expecting ::= at offset {pos}")
            pos = self.alternates(self.space(pos + 3, True), rule)
            if pos < self.n:
                if self.s[pos] == "\r":
                    pos += 2 if self.s[pos + 1 : pos + 2] == "\n" else 1
                elif self.s[pos] == "\n":
                    pos += 1
                else:
                    raise Malformed(f"expecting a newline or the end at offset {pos}")
            pos = self.space(pos, True)
        undefined = sorted(self.names - self.defined)
        if undefined:
            raise Malformed(f"undefined rule {undefined[0]!r}")
        if "root" not in self.defined:
            raise Malformed("no 'root' rule")
        self.shape()

    def alternates(self, pos: int, rule: str) -> int:
        """One rule's body, groups included, with an explicit stack instead of recursion."""
        s, n, lim = self.s, self.n, self.limits
        frames = [_Frame(nested=False, rule=rule)]
        self.structure[rule] = []
        while True:
            f = frames[-1]
            c = s[pos] if pos < n else ""
            if c == '"':
                start, before, pos = pos, f.size, pos + 1
                while pos >= n or s[pos] != '"':
                    if pos >= n:
                        raise Malformed(f"unterminated literal at offset {start}")
                    pos = self.char(pos)
                    self.grow(f, 1)
                self.added(f, before, None if f.size > before else "")
                pos = self.space(pos + 1, f.nested)
            elif c == "[":
                start, before, pos = pos, f.size, pos + 1
                if pos < n and s[pos] == "^":
                    pos += 1
                while pos >= n or s[pos] != "]":
                    if pos >= n:
                        raise Malformed(f"unterminated character class at offset {start}")
                    pos = self.char(pos)
                    self.grow(f, 1)
                    if s[pos : pos + 1] == "-" and s[pos + 1 : pos + 2] not in ("]", ""):
                        pos = self.char(pos + 1)
                        self.grow(f, 1)
                self.added(f, before, None)
                pos = self.space(pos + 1, f.nested)
            elif c in ("<", "!"):
                self.has_tokens = True
                pos += 1 if c == "!" else 0
                if s[pos : pos + 1] != "<":
                    raise Malformed(f"expecting '<' at offset {pos}")
                end = s.find(">", pos)
                if end == -1:
                    raise Malformed(f"expecting '>' after offset {pos}")
                self.grow(f, 1)
                self.added(f, f.size - 1, None)
                pos = self.space(end + 1, f.nested)
            elif c in _WORD:
                end = self.name(pos)
                self.names.add(s[pos:end])
                self.grow(f, 1)
                self.added(f, f.size - 1, s[pos:end])
                pos = self.space(end, f.nested)
            elif c == "(":
                if len(frames) >= lim.max_depth:
                    raise OverLimit(f"groups nested deeper than {lim.max_depth}", "GRAMMAR_MAX_DEPTH")
                group = f"({self.generated})"
                frames.append(_Frame(nested=True, rule=group, generated_before=self.generated))
                self.structure[group] = []
                self.generated += 1
                self.depth = max(self.depth, len(frames))
                pos = self.space(pos + 1, True)
            elif c == ".":
                self.grow(f, 1)
                self.added(f, f.size - 1, None)
                pos = self.space(pos + 1, f.nested)
            elif c in ("*", "+", "?"):
                pos = self.space(pos + 1, f.nested)
                self.repeat(f, 1 if c == "+" else 0, 1 if c == "?" else None)
            elif c == "{":
                pos = self.space(pos + 1, f.nested)
                lo, pos = self.integer(pos)
                pos = self.space(pos, f.nested)
                hi: int | None = lo
                if s[pos : pos + 1] == ",":
                    pos = self.space(pos + 1, f.nested)
                    hi = None
                    if pos < n and "0" <= s[pos] <= "9":
                        hi, pos = self.integer(pos)
                        pos = self.space(pos, f.nested)
                elif s[pos : pos + 1] != "}":
                    raise Malformed(f"expecting ',' or '}}' at offset {pos}")
                if s[pos : pos + 1] != "}":
                    raise Malformed(f"expecting '}}' at offset {pos}")
                pos = self.space(pos + 1, f.nested)
                if hi is not None and hi < lo:
                    raise Malformed(f"repetition {{{lo},{hi}}} has its maximum below its minimum")
                bound = max(lo, hi or 0)
                if bound > lim.max_repetition:
                    raise OverLimit(
                        f"a repetition bound of {bound}, over the limit of {lim.max_repetition}",
                        "GRAMMAR_MAX_REPETITION",
                    )
                self.repetition = max(self.repetition, bound)
                self.repeat(f, lo, hi)
            elif c == "|":
                f.alts += 1
                self.symbols += 1
                self.alternatives = max(self.alternatives, f.alts)
                if f.alts > lim.max_alternatives:
                    raise OverLimit(
                        f"a rule with more than {lim.max_alternatives} alternatives",
                        "GRAMMAR_MAX_ALTERNATIVES",
                    )
                self.structure[f.rule].append(f.items)
                f.items = []
                f.new_sequence()
                pos = self.space(pos + 1, True)
            else:  # the end of these alternates: a group closes, or the rule ends
                self.symbols += 1
                frames.pop()
                self.structure[f.rule].append(f.items)
                if not f.nested:
                    return pos
                if c != ")":
                    raise Malformed(f"expecting ')' at offset {pos}")
                parent = frames[-1]
                self.grow(parent, 1)
                self.added(parent, parent.size - 1, f.rule)
                parent.n_prev_rules = max(1, self.generated - f.generated_before)
                pos = self.space(pos + 1, parent.nested)
            self.budget()

    def grow(self, f: _Frame, k: int) -> None:
        f.size += k
        self.symbols += k

    @staticmethod
    def added(f: _Frame, start: int, ref: str | None) -> None:
        """An item now spans ``start..f.size`` of the current sequence: a reference to rule
        ``ref``, a terminal (None), or nothing at all (an empty literal, "")."""
        if ref != "":
            f.items.append([ref, False, False, 1])
        f.last_start = start
        f.n_prev_rules = 1
        if not f.optional:
            f.run = 0
        f.optional = False

    def repeat(self, f: _Frame, lo: int, hi: int | None) -> None:
        """``x{lo,hi}`` as llama.cpp rewrites it: x copied lo times, then hi - lo rules (one
        when unbounded) of the shape ``x' ::= x x'' |``."""
        if f.last_start < 0 or f.last_start == f.size:  # nothing, or an empty literal
            raise Malformed("a repetition operator with nothing before it")
        prev = f.size - f.last_start
        total = hi if hi is not None and hi > 0 else (lo if lo > 0 else 1)
        if f.n_prev_rules * total > LLAMA_REPETITION_THRESHOLD:
            raise OverLimit(
                f"nested repetitions that expand to over {LLAMA_REPETITION_THRESHOLD} rules",
                "GRAMMAR_MAX_REPETITION",
            )
        self.grow(f, -prev if lo == 0 else (lo - 1) * prev)
        n_opt = 1 if hi is None else hi - lo
        self.generated += n_opt
        self.symbols += n_opt * (prev + 3)
        if n_opt > 0:
            self.grow(f, 1)
        f.n_prev_rules *= total
        if f.items:
            item = f.items[-1]
            if hi is None and item[1]:
                raise Malformed("left recursion: an unbounded repetition (*, +, {m,}) of an "
                              "optional item, which can be empty")
            if lo == 0:
                item[1] = True  # optional
            if hi is None:
                item[2] = True  # unbounded: llama.cpp writes x* as S ::= x S |
            item[3] *= max(lo, hi or 1)  # how many x in a row it can stand for
        if lo > 0:
            f.optional, f.run = False, 0
        elif not f.optional:
            f.optional, f.run = True, f.run + 1
            self.optionals = max(self.optionals, f.run)
            if f.run > self.limits.max_optionals:
                raise OverLimit(
                    f"more than {self.limits.max_optionals} optional items in a row",
                    "GRAMMAR_MAX_OPTIONALS",
                )

    def shape(self) -> None:
        """What a sampling step may face, from the rules' structure, in linear time: the most
        grammar positions one point can fan out to (llama.cpp keeps one stack per position and
        deduplicates them in quadratic time) and the most items that can be skipped (optional,
        or rules that can be empty) a leftmost path passes in a row, through rule references
        (``r1 ::= "a"? r2``, ``r2 ::= "a"? r3``, ...: a chain of 4000 hangs llama.cpp's grammar
        set-up; ``x{47}`` of an x that can be empty makes each character's work explode). Left recursion is refused as llama.cpp
        refuses it (it only sees through rules with a literally empty alternative, and rewrites
        ``x*`` as ``S ::= x S |``); the cost measures see through anything that can be empty."""
        rules = self.structure
        # llama.cpp's "may be empty": an alternative with no items at all
        shallow = {r for r, alts in rules.items() if any(not items for items in alts)}
        deep = self._nullable()

        def see_through(item: list[Any], nullable: set[str]) -> bool:
            ref, optional = item[0], item[1]
            return optional or (ref is not None and ref in nullable)

        for alts in rules.values():
            for items in alts:
                for item in items:
                    if item[2] and item[0] in shallow:
                        what = "a group" if item[0].startswith("(") else repr(item[0])
                        raise Malformed(
                            f"left recursion: an unbounded repetition (*, +, {{m,}}) of {what}, "
                            "which can be empty"
                        )
        self._walk(lambda alt: self._leftmost(alt, shallow, see_through), on_cycle="refuse")
        fan: dict[str, int] = {}
        run: dict[str, int] = {}

        def cost(rule: str) -> None:
            """From the rule's start (for its callers) and from every position inside it: the
            positions one point reaches, and the skippable items passed in a row."""
            start_fan, start_run = 0, 0
            for alt in rules.get(rule, ()):
                fans = [0] * (len(alt) + 1)  # from position i on, right to left
                runs = [0] * (len(alt) + 1)
                reach = [0] * (len(alt) + 1)  # skippable items from i on, in a row
                for i in range(len(alt) - 1, -1, -1):
                    item = alt[i]
                    ref, span = item[0], item[3]
                    copies = span if ref is not None and ref in deep else 1
                    item_fan = (1 if ref is None else fan.get(ref, 1)) * copies
                    inner = 0 if ref is None else run.get(ref, 0)
                    if see_through(item, deep):
                        fans[i] = item_fan + fans[i + 1]
                        # x{n} / x{0,n} of an x that can be empty: n skippable items in a row;
                        # of an x that cannot, one optional chain (llama.cpp keeps it linear)
                        reach[i] = copies * max(inner, 1) + reach[i + 1]
                    else:
                        fans[i] = item_fan
                        reach[i] = inner
                    runs[i] = max(reach[i], inner)
                    if max(fans[i], 0) > self.limits.max_alternatives:
                        raise OverLimit(
                            f"one point of the grammar fans out to over "
                            f"{self.limits.max_alternatives} alternatives",
                            "GRAMMAR_MAX_ALTERNATIVES",
                        )
                    if runs[i] > self.limits.max_optionals:
                        raise OverLimit(
                            f"more than {self.limits.max_optionals} optional items in a row "
                            "(counted through rule references and repetitions)",
                            "GRAMMAR_MAX_OPTIONALS",
                        )
                    self.fanout = max(self.fanout, fans[i])
                    self.run_through = max(self.run_through, runs[i])
                start_fan += fans[0] if alt else 0
                start_run = max(start_run, runs[0] if alt else 0)
            fan[rule], run[rule] = max(start_fan, 1), start_run
            if start_fan > self.limits.max_alternatives:
                raise OverLimit(
                    f"one point of the grammar fans out to over {self.limits.max_alternatives} "
                    "alternatives",
                    "GRAMMAR_MAX_ALTERNATIVES",
                )
            self.fanout = max(self.fanout, start_fan)

        self._walk(lambda alt: self._leftmost(alt, deep, see_through), on_cycle="skip", visit=cost)

    @staticmethod
    def _leftmost(items: list[list[Any]], nullable: set[str], see_through: Any) -> list[list[Any]]:
        """The items a leftmost expansion of one alternative reaches."""
        out = []
        for item in items:
            out.append(item)
            if not see_through(item, nullable):
                break
        return out

    def _nullable(self) -> set[str]:
        """Rules that can match the empty text (a worklist over reverse references: linear)."""
        nullable: set[str] = set()
        need: dict[tuple[str, int], int] = {}
        users: dict[str, list[tuple[str, int]]] = {}
        for rule, alts in self.structure.items():
            for i, items in enumerate(alts):
                required = [ref for ref, opt, _, _ in items if not opt]
                if any(ref is None for ref in required):
                    continue  # a required terminal: this alternative is never empty
                need[(rule, i)] = len(required)
                for ref in required:
                    users.setdefault(ref, []).append((rule, i))
                if not required:
                    nullable.add(rule)
        todo = list(nullable)
        while todo:
            for owner, i in users.get(todo.pop(), ()):
                need[(owner, i)] -= 1
                if need[(owner, i)] == 0 and owner not in nullable:
                    nullable.add(owner)
                    todo.append(owner)
        return nullable

    def _walk(self, reach: Any, on_cycle: str, visit: Any = None) -> None:
        """Post-order over leftmost references, iteratively: ``visit`` each rule after the
        rules it starts with; a cycle is left recursion (refused) or, for the cost measures,
        an edge not followed."""
        rules = self.structure
        state: dict[str, int] = {}  # 1: in progress, 2: done
        for start in rules:
            if start in state:
                continue
            state[start] = 1
            stack = [(start, iter([item[0] for alt in rules[start] for item in reach(alt)]))]
            while stack:
                rule, refs = stack[-1]
                for ref in refs:
                    if ref is None or ref not in rules or state.get(ref) == 2:
                        continue
                    if state.get(ref) == 1:
                        if on_cycle == "refuse":
                            raise Malformed(f"left recursion through rule {ref!r}")
                        continue
                    state[ref] = 1
                    stack.append((ref, iter([item[0] for alt in rules[ref] for item in reach(alt)])))
                    break
                else:
                    stack.pop()
                    state[rule] = 2
                    if visit is not None:
                        visit(rule)

    def budget(self) -> None:
        self.steps += 1
        if self.steps % 2048 == 0:
            _yield_gil()  # a long parse on a worker thread must not starve the engine thread
        lim = self.limits
        if len(self.names) + self.generated > lim.max_rules:
            raise OverLimit(f"more than {lim.max_rules} rules once expanded", "GRAMMAR_MAX_RULES")
        if self.symbols > lim.max_symbols:
            raise OverLimit(f"more than {lim.max_symbols} symbols once expanded", "GRAMMAR_MAX_SYMBOLS")

    def stats(self) -> Stats:
        return Stats(
            rules=len(self.names) + self.generated,
            symbols=self.symbols,
            depth=self.depth,
            alternatives=max(self.alternatives, self.fanout),
            optionals=max(self.optionals, self.run_through),
            repetition=self.repetition,
            has_tokens=self.has_tokens,
        )


def measure(text: str, limits: Bounds) -> Stats:
    """What ``text`` costs llama.cpp's parser: Malformed when llama.cpp would refuse it,
    OverLimit at the first bound of ``limits`` it crosses."""
    parser = _Parser(text, limits)
    parser.parse()
    parser.budget()
    return parser.stats()


def _yield_gil() -> None:
    """Let the engine thread run: a long parse on a worker thread holds the GIL."""
    original_sleep(0)
