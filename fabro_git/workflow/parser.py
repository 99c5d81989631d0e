"""Read the DOT subset that workflows are written in.

A hand-written tokenizer and recursive-descent parser rather than a Graphviz binding:
workflow files are user input, and every mistake in one must come back as a
`WorkflowError` naming the file, line and column and saying what was expected there.
Graphviz is only needed to draw pictures (`git fabro graph`), never to run a workflow.

Subgraphs are flattened: their nodes and edges join the one graph, their `node`/`edge`
defaults apply only inside them, and a subgraph `label` becomes a class on the nodes
declared (or first created) inside it, so stylesheets can target a whole cluster.
"""

from __future__ import annotations

import collections
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec

from fabro_git.errors import WorkflowError
from fabro_git.workflow.model import (
    NODE_ID_RE,
    Edge,
    Graph,
    Node,
    Subgraph,
    collector_paused,
    node_id_problem,
)

# Token kinds.
WORD = "word"
STRING = "string"
PUNCT = "punct"
EOF = "end of file"

IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_WORD_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.")
# The rest of a word: a '-' belongs to it unless it starts '--' or '->'.
_WORD_REST_RE = re.compile(r"(?:[A-Za-z0-9_.:]|-(?![->]))*")
_SPACE_RE = re.compile(r"[ \t\r\n\f\v]+")
_STRING_RUN_RE = re.compile(r'[^"\\]*')
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}
_MAX_DEPTH = 64


class Token(msgspec.Struct, frozen=True):
    kind: str
    value: str
    line: int
    column: int

    def describe(self) -> str:
        if self.kind == EOF:
            return "end of file"
        if self.kind == STRING:
            shown = self.value if len(self.value) <= 30 else self.value[:27] + "..."
            return f"string {shown!r}"
        return repr(self.value)


class _Lexer:
    def __init__(self, text: str, path: Path | None) -> None:
        self.text = text
        self.path = path
        self.pos = 0
        self.line = 1
        self.column = 1

    def error(self, message: str, line: int, column: int, hint: str | None = None) -> WorkflowError:
        return WorkflowError(message, path=self.path, line=line, column=column, hint=hint)

    def _advance(self, count: int = 1) -> None:
        end = self.pos + count
        newlines = self.text.count("\n", self.pos, end)
        if newlines:
            self.line += newlines
            self.column = end - self.text.rfind("\n", self.pos, end)
        else:
            self.column += count
        self.pos = end

    def _at_line_start(self) -> bool:
        start = self.text.rfind("\n", 0, self.pos) + 1
        return self.text[start : self.pos].strip() == ""

    def _skip_trivia(self) -> None:
        text = self.text
        while self.pos < len(text):
            char = text[self.pos]
            if char in " \t\r\n\f\v":
                match = _SPACE_RE.match(text, self.pos)
                assert match is not None
                self._advance(match.end() - self.pos)
            elif text.startswith("//", self.pos) or (char == "#" and self._at_line_start()):
                end = text.find("\n", self.pos)
                self._advance((len(text) if end < 0 else end) - self.pos)
            elif text.startswith("/*", self.pos):
                line, column = self.line, self.column
                end = text.find("*/", self.pos + 2)
                if end < 0:
                    raise self.error("unterminated /* comment: expected '*/'", line, column)
                self._advance(end + 2 - self.pos)
            else:
                return

    def tokens(self) -> Iterator[Token]:
        """Tokens on demand, so a parse error earlier in the file wins over a lexing one."""
        text = self.text
        while True:
            self._skip_trivia()
            if self.pos >= len(text):
                yield Token(EOF, "", self.line, self.column)
                return
            line, column = self.line, self.column
            char = text[self.pos]
            nxt = text[self.pos + 1] if self.pos + 1 < len(text) else ""
            if char == '"':
                yield Token(STRING, self._string(), line, column)
            elif char == "-" and nxt == ">":
                self._advance(2)
                yield Token(PUNCT, "->", line, column)
            elif char == "-" and nxt == "-":
                raise self.error(
                    "undirected edge '--' is not supported: workflows are directed, use '->'",
                    line,
                    column,
                )
            elif char in "{}[]=,;+":
                self._advance()
                yield Token(PUNCT, char, line, column)
            elif char in _WORD_START or (char == "-" and (nxt.isdigit() or nxt == ".")):
                yield Token(WORD, self._word(), line, column)
            elif char == "<":
                raise self.error(
                    "HTML-like <...> values are not supported: use a double-quoted string",
                    line,
                    column,
                )
            elif char == "'":
                raise self.error(
                    "single quotes are not string delimiters here: use double quotes", line, column
                )
            else:
                raise self.error(f"unexpected character {char!r}", line, column)

    def _word(self) -> str:
        start = self.pos
        match = _WORD_REST_RE.match(self.text, start + 1)
        assert match is not None
        self._advance(match.end() - start)
        return self.text[start : self.pos]

    def _string(self) -> str:
        text = self.text
        line, column = self.line, self.column
        self._advance()  # opening quote
        parts: list[str] = []
        while True:
            if self.pos >= len(text):
                raise self.error(
                    "unterminated string: expected a closing '\"'",
                    line,
                    column,
                    hint='write a literal quote inside a string as \\"',
                )
            run = _STRING_RUN_RE.match(text, self.pos)
            assert run is not None
            if run.end() > self.pos:
                parts.append(run.group())
                self._advance(run.end() - self.pos)
                continue
            char = text[self.pos]
            if char == '"':
                self._advance()
                return "".join(parts)
            if char == "\\":
                nxt = text[self.pos + 1 : self.pos + 2]
                if nxt == "\n":
                    self._advance(2)
                elif nxt == "\r" and text[self.pos + 2 : self.pos + 3] == "\n":
                    self._advance(3)
                elif nxt in _ESCAPES:
                    parts.append(_ESCAPES[nxt])
                    self._advance(2)
                else:
                    # Graphviz keeps other escapes (\l, \d in a regex...) as written.
                    parts.append(char)
                    self._advance()
                continue
            parts.append(char)
            self._advance()


class _Scope(msgspec.Struct):
    """Defaults and membership of the graph body or one subgraph."""

    node_defaults: dict[str, str]
    node_default_positions: dict[str, tuple[int, int]]
    edge_defaults: dict[str, str]
    edge_default_positions: dict[str, tuple[int, int]]
    record: Subgraph | None = None
    # Node ids declared or first used in this scope, in order (a dict as an ordered set).
    members: dict[str, None] = msgspec.field(default_factory=dict)

    def child(self, record: Subgraph) -> _Scope:
        return _Scope(
            dict(self.node_defaults),
            dict(self.node_default_positions),
            dict(self.edge_defaults),
            dict(self.edge_default_positions),
            record,
        )


Attrs = list[tuple[str, str, int, int]]


class _Parser:
    def __init__(self, text: str, path: Path | None) -> None:
        self.path = path
        self._stream = _Lexer(text, path).tokens()
        # Lookahead only: consumed tokens are dropped, so a big file does not keep
        # millions of them alive for the garbage collector to walk.
        self.tokens: collections.deque[Token] = collections.deque()
        self.depth = 0
        self.graph = Graph(name="", path=path, source=text)

    # Token helpers -----------------------------------------------------------------

    def peek(self, offset: int = 0) -> Token:
        tokens = self.tokens
        if offset < len(tokens):
            return tokens[offset]
        while len(tokens) <= offset and (not tokens or tokens[-1].kind != EOF):
            tokens.append(next(self._stream))
        return tokens[min(offset, len(tokens) - 1)]

    def next(self) -> Token:
        token = self.peek()
        if token.kind != EOF:
            self.tokens.popleft()
        return token

    def is_punct(self, value: str, offset: int = 0) -> bool:
        token = self.peek(offset)
        return token.kind == PUNCT and token.value == value

    def error(self, message: str, token: Token, hint: str | None = None) -> WorkflowError:
        return WorkflowError(
            message, path=self.path, line=token.line, column=token.column, hint=hint
        )

    def expect_punct(self, value: str, context: str) -> Token:
        token = self.next()
        if token.kind != PUNCT or token.value != value:
            raise self.error(f"expected '{value}' {context}, found {token.describe()}", token)
        return token

    # Grammar -------------------------------------------------------------------------

    def parse(self) -> Graph:
        first = self.next()
        if first.kind == EOF:
            raise self.error("empty workflow: expected 'digraph NAME { ... }'", first)
        if first.kind == WORD and first.value.lower() == "strict":
            raise self.error("'strict' graphs are not supported: remove 'strict'", first)
        if first.kind == WORD and first.value.lower() == "graph":
            raise self.error(
                "undirected 'graph' is not supported: a workflow is a 'digraph'", first
            )
        if first.kind != WORD or first.value.lower() != "digraph":
            raise self.error(
                f"expected 'digraph' at the start of a workflow, found {first.describe()}",
                first,
                hint="a workflow file looks like: digraph MyWorkflow { start -> exit }",
            )
        self.graph.line, self.graph.column = first.line, first.column
        name = self.next()
        if name.kind == PUNCT and name.value == "{":
            raise self.error("the graph needs a name: expected 'digraph NAME {'", name)
        if name.kind == STRING or (name.kind == WORD and IDENT_RE.match(name.value)):
            self.graph.name = name.value
        else:
            raise self.error(
                f"expected a graph name after 'digraph', found {name.describe()}", name
            )
        self.expect_punct("{", "to open the graph body")
        root = _Scope({}, {}, {}, {})
        self.body(root)
        close = self.next()
        if close.kind == EOF:
            raise self.error("unexpected end of file: expected '}' to close the graph", close)
        trailing = self.peek()
        if trailing.kind != EOF:
            raise self.error(
                f"unexpected {trailing.describe()} after the graph's closing '}}': "
                "a workflow file holds exactly one digraph",
                trailing,
            )
        self.finish()
        return self.graph

    def body(self, scope: _Scope) -> None:
        """Statements up to (not including) the closing brace."""
        while True:
            token = self.peek()
            if token.kind == EOF:
                return
            if token.kind == PUNCT and token.value == "}":
                return
            if token.kind == PUNCT and token.value == ";":
                self.next()
                continue
            self.statement(scope)

    def statement(self, scope: _Scope) -> None:
        token = self.peek()
        if (
            token.kind == WORD
            and token.value in ("graph", "node", "edge")
            and self.is_punct("[", 1)
        ):
            self.next()
            attrs = self.attr_lists()
            if token.value == "graph":
                self.set_graph_attrs(scope, attrs)
            elif token.value == "node":
                for key, value, line, column in attrs:
                    scope.node_defaults[key] = value
                    scope.node_default_positions[key] = (line, column)
            else:
                for key, value, line, column in attrs:
                    scope.edge_defaults[key] = value
                    scope.edge_default_positions[key] = (line, column)
            return
        if (
            token.kind == WORD
            and token.value in ("node", "edge", "graph")
            and not self.is_punct("=", 1)
        ):
            after = self.peek(1)
            raise self.error(
                f"expected '[' after '{token.value}', found {after.describe()}",
                after,
                hint=f"'{token.value}' is a keyword; a node with that name needs another id",
            )
        if token.kind == WORD and token.value in ("digraph", "strict"):
            raise self.error(
                f"unexpected '{token.value}' inside the graph: a workflow file holds one digraph",
                token,
            )
        if (token.kind in (WORD, STRING)) and self.is_punct("=", 1):
            key_token = self.next()
            self.next()  # '='
            key = self.check_key(key_token)
            value, line, column = self.value(key)
            self.set_graph_attrs(scope, [(key, value, line, column)])
            return
        sources, is_subgraph = self.endpoint(scope)
        if self.is_punct("->"):
            self.edge_chain(scope, sources)
            return
        if is_subgraph:
            if self.is_punct("["):
                raise self.error("attributes cannot follow a subgraph", self.peek())
            return
        attrs = self.attr_lists() if self.is_punct("[") else []
        _node_id, id_token = sources[0]
        assert id_token is not None
        self.declare_node(scope, id_token, attrs)

    def endpoint(self, scope: _Scope) -> tuple[list[tuple[str, Token | None]], bool]:
        """A node id, or a subgraph standing for every node inside it."""
        token = self.peek()
        if (token.kind == PUNCT and token.value == "{") or (
            token.kind == WORD and token.value == "subgraph"
        ):
            return [(node_id, None) for node_id in self.subgraph(scope)], True
        token = self.next()
        if token.kind == EOF:
            raise self.error("unexpected end of file: expected '}' to close the graph", token)
        if token.kind == PUNCT:
            raise self.error(
                f"expected a statement (node, edge, attribute or subgraph), found {token.describe()}",
                token,
            )
        node_id = token.value
        # Only the character set is a syntax error; an over-long id parses, and the
        # validator's `node_id_valid` reports it with every other problem.
        if not NODE_ID_RE.match(node_id):
            hint = 'put display text in label="..."'
            if token.kind == WORD and ":" in node_id:
                hint = "node ports (id:port) are not supported"
            raise self.error(
                f"invalid node id {_shown(node_id)}: {node_id_problem(node_id)}",
                token,
                hint=hint,
            )
        return [(node_id, token)], False

    def subgraph(self, scope: _Scope) -> list[str]:
        start = self.next()
        name: str | None = None
        if start.kind == WORD and start.value == "subgraph":
            if self.peek().kind in (WORD, STRING):
                name = self.next().value
            brace = self.expect_punct("{", "to open the subgraph")
        else:
            brace = start
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise self.error(f"subgraphs are nested more than {_MAX_DEPTH} deep", brace)
        record = Subgraph(name=name, attrs={}, node_ids=[], line=start.line, column=start.column)
        inner = scope.child(record)
        self.body(inner)
        close = self.next()
        if close.kind == EOF:
            raise self.error(
                f"unexpected end of file: expected '}}' to close the subgraph opened at line {start.line}",
                close,
            )
        self.depth -= 1
        css_class = class_from_label(record.attrs.get("label", ""))
        if css_class:
            for node_id in inner.members:
                node = self.graph.nodes[node_id]
                if css_class not in node.classes:
                    node.classes.append(css_class)
        record.node_ids = list(inner.members)
        if scope.record is None:
            self.graph.subgraphs.append(record)
        else:
            scope.record.children.append(record)
        scope.members.update(inner.members)
        return list(inner.members)

    def edge_chain(self, scope: _Scope, first: list[tuple[str, Token | None]]) -> None:
        # Endpoints referenced only here become nodes, with the current node defaults,
        # in the order they appear.
        def create(group: list[tuple[str, Token | None]]) -> None:
            for node_id, token in group:
                if token is not None and node_id not in self.graph.nodes:
                    self.create_node(scope, node_id, token, declared=False)

        create(first)
        groups = [first]
        while self.is_punct("->"):
            self.next()
            after = self.peek()
            if after.kind == EOF or (after.kind == PUNCT and after.value in "[;}]"):
                raise self.error(f"expected a node id after '->', found {after.describe()}", after)
            groups.append(self.endpoint(scope)[0])
            create(groups[-1])
        attrs = self.attr_lists() if self.is_punct("[") else []
        for left, right in itertools.pairwise(groups):
            for source, source_token in left:
                if source_token is not None:
                    line, column = source_token.line, source_token.column
                else:
                    line, column = self.graph.nodes[source].line, self.graph.nodes[source].column
                for target, _ in right:
                    edge = Edge(
                        source=source,
                        target=target,
                        attrs=dict(scope.edge_defaults),
                        line=line,
                        column=column,
                        positions=dict(scope.edge_default_positions),
                        path=self.path,
                    )
                    for key, value, vline, vcolumn in attrs:
                        edge.attrs[key] = value
                        edge.positions[key] = (vline, vcolumn)
                    self.graph.edges.append(edge)

    def create_node(self, scope: _Scope, node_id: str, token: Token, *, declared: bool) -> Node:
        node = Node(
            id=node_id,
            attrs=dict(scope.node_defaults),
            line=token.line,
            column=token.column,
            positions=dict(scope.node_default_positions),
            declared=declared,
            path=self.path,
        )
        self.graph.nodes[node_id] = node
        scope.members[node_id] = None
        return node

    def declare_node(self, scope: _Scope, token: Token, attrs: Attrs) -> None:
        node = self.graph.nodes.get(token.value)
        if node is None:
            node = self.create_node(scope, token.value, token, declared=True)
        else:
            if not node.declared:
                node.declared = True
                node.line, node.column = token.line, token.column
            scope.members[token.value] = None
        for key, value, line, column in attrs:
            node.attrs[key] = value
            node.positions[key] = (line, column)

    def set_graph_attrs(self, scope: _Scope, attrs: Attrs) -> None:
        if scope.record is not None:
            for key, value, line, column in attrs:
                scope.record.attrs[key] = value
                scope.record.positions[key] = (line, column)
            return
        for key, value, line, column in attrs:
            self.graph.attrs[key] = value
            self.graph.positions[key] = (line, column)

    def attr_lists(self) -> Attrs:
        attrs: Attrs = []
        while self.is_punct("["):
            self.next()
            while True:
                token = self.peek()
                if token.kind == PUNCT and token.value == "]":
                    self.next()
                    break
                if token.kind == PUNCT and token.value in ",;":
                    self.next()
                    continue
                if token.kind == EOF:
                    raise self.error(
                        "unexpected end of file: expected ']' to close the attribute list", token
                    )
                if token.kind not in (WORD, STRING):
                    raise self.error(
                        f"expected an attribute name or ']', found {token.describe()}", token
                    )
                key = self.check_key(self.next())
                self.expect_punct("=", f"after attribute name '{key}'")
                value, line, column = self.value(key)
                attrs.append((key, value, line, column))
        return attrs

    def check_key(self, token: Token) -> str:
        if not KEY_RE.match(token.value):
            raise self.error(
                f"invalid attribute name {token.value!r}: expected a name like 'label' or 'manager.poll_interval'",
                token,
            )
        return token.value

    def value(self, key: str) -> tuple[str, int, int]:
        token = self.next()
        if token.kind == WORD:
            return token.value, token.line, token.column
        if token.kind != STRING:
            raise self.error(f"expected a value for '{key}', found {token.describe()}", token)
        parts = [token.value]
        while self.is_punct("+"):
            self.next()
            more = self.next()
            if more.kind != STRING:
                raise self.error(f"expected a string after '+', found {more.describe()}", more)
            parts.append(more.value)
        return "".join(parts), token.line, token.column

    def finish(self) -> None:
        for node in self.graph.nodes.values():
            own = split_classes(node.attrs.get("class", ""))
            derived = [c for c in node.classes if c not in own]
            node.classes = own + derived


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


def class_from_label(label: str) -> str:
    """`"Loop A"` → `loop-a`: lowercase, spaces to hyphens, other punctuation dropped."""
    lowered = re.sub(r"\s+", "-", label.strip().lower())
    return re.sub(r"[^a-z0-9-]", "", lowered)


def split_classes(value: str) -> list[str]:
    out: list[str] = []
    for part in re.split(r"[,\s]+", value):
        if part and part not in out:
            out.append(part)
    return out


def parse(text: str, path: Path | None = None) -> Graph:
    """Parse workflow source into a `Graph` and apply its model stylesheet.

    Raises `WorkflowError` (with line and column) for any syntax error. A malformed
    stylesheet is left for the validator to report.
    """
    from fabro_git.workflow.stylesheet import apply_stylesheet

    if text.startswith("\ufeff"):
        text = text[1:]
    # Windows line endings would otherwise leave "\r" inside multi-line strings.
    with collector_paused():
        graph = _Parser(text.replace("\r\n", "\n"), path).parse()
        graph.source = text
        apply_stylesheet(graph)
    return graph
