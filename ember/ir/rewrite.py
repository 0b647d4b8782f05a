"""Pattern rewriting of the IR: rules as data (the ops a rule looks at, when it applies, what it builds instead),
run as each node is built (the simplifier, ir/simplify.py) or over a whole DAG, bottom-up to a fixed point."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ember.ir.ir import Builder, IRNode


@dataclass(frozen=True)
class Rule:
    """One rewrite: a node whose op is in `ops` and for which `applies(node)` holds is replaced by
    `build(builder, node)` (built with the builder, so it is simplified too); `build` may still return None (no
    change), for rules whose pattern is only known once they look further. `final`: the rule promises that what it
    builds holds no node its table rewrites, so `rewrite` does not walk the replacement again (an expansion into
    other ops)."""

    name: str
    ops: frozenset[Any]
    applies: Callable[[IRNode], bool]
    build: Callable[[Builder, IRNode], IRNode | None]
    final: bool = False


class RuleTable:
    """Rules indexed by op; for a node, the first rule (in table order) that fires gives its replacement."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = tuple(rules)
        by_op: dict[Any, list[Rule]] = {}
        for rule in self.rules:
            for op in rule.ops:
                by_op.setdefault(op, []).append(rule)
        self.by_op: dict[Any, tuple[Rule, ...]] = {op: tuple(rules) for op, rules in by_op.items()}
        # the same as (applies, build) pairs: what Builder.alu runs for every node it builds
        self.matchers: dict[Any, tuple[tuple[Callable[[IRNode], bool], Callable[[Builder, IRNode], IRNode | None]],
                                       ...]] = {op: tuple((rule.applies, rule.build) for rule in rules)
                                                for op, rules in self.by_op.items()}

    def __add__(self, other: RuleTable) -> RuleTable:
        return RuleTable(self.rules + other.rules)

    def first(self, builder: Builder, node: IRNode) -> IRNode | None:
        """The replacement of `node` by the first rule that fires on it, or None."""
        fired = self.fire(builder, node)
        return None if fired is None else fired[0]

    def fire(self, builder: Builder, node: IRNode) -> tuple[IRNode, Rule] | None:
        """The replacement of `node` by the first rule that fires on it, and that rule; or None."""
        for rule in self.by_op.get(node.op, ()):
            if rule.applies(node):
                replacement = rule.build(builder, node)
                if replacement is not None:
                    return replacement, rule
        return None


def rewrite(root: IRNode, rules: RuleTable, builder: Builder) -> IRNode:
    """`root` rebuilt with `builder`, every node (also those the rules build) rewritten by `rules` until none fires:
    sources first, on an explicit stack (a chain of 100,000 nodes takes memory, not Python frames).

    Each node of the old DAG is rebuilt over the rewritten sources; when a rule replaces it, the replacement's new
    nodes are rewritten in turn and the node stands for the replacement's rewritten form. A rule set that keeps
    producing new matches does not terminate, as with any rewriting to a fixed point."""
    normal: dict[int, IRNode] = {}  # id of a node (old or built) -> its rewritten form
    replaced: dict[int, IRNode] = {}  # id of a node -> the replacement a rule gave (waiting to be rewritten)
    by_op = rules.by_op
    # (node, built by `builder` already, sources pushed already)
    stack: list[tuple[IRNode, bool, bool]] = [(root, False, False)]
    while stack:
        node, built, expanded = stack.pop()
        key = id(node)
        if key in normal:
            continue
        if not expanded:
            stack.append((node, built, True))
            stack.extend((source, built, False) for source in reversed(node.srcs) if id(source) not in normal)
            continue
        replacement = replaced.pop(key, None)
        if replacement is not None:
            normal[key] = normal[id(replacement)]
            continue
        sources = [normal[id(source)] for source in node.srcs]
        if built and all(new is old for new, old in zip(sources, node.srcs)):
            rebuilt = node
        else:
            rebuilt = builder.rebuild(node, sources)
        fired = rules.fire(builder, rebuilt) if rebuilt.op in by_op else None
        if fired is None or fired[0] is rebuilt:
            normal[key] = normal[id(rebuilt)] = rebuilt
            continue
        replacement, rule = fired
        if rule.final:  # nothing in it to rewrite
            normal[key] = normal[id(replacement)] = replacement
        else:  # rewrite what the rule built (its sources are rewritten already), then come back to this node
            replaced[key] = replacement
            stack.append((node, built, True))
            stack.append((replacement, True, False))
    return normal[id(root)]
