"""A radix tree of KV blocks with least-recently-used leaf eviction (the prefix cache of SGLang,
which LLMServingSim's KV tiers use).

Keys are sequences of block ids from a prompt's start; a node holds a run of blocks that no
other cached prefix splits (a new prefix's unmatched tail becomes one node), and a lookup that
stops inside a node splits it. Eviction removes whole nodes, least recently used leaves first,
so a parent goes only after all its children: an evicted node may free more blocks than were
needed. A locked node (and so every ancestor: locks count along the path) is never evicted.
Recency is a counter advanced by every operation: processing order, which in an event-driven
simulator is simulated-time order.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence


class Node:
    __slots__ = ("key", "children", "parent", "stamp", "locks", "alive", "id")

    def __init__(self, key: tuple, parent: Node | None, stamp: int, ident: int):
        self.key, self.parent, self.stamp, self.id = key, parent, stamp, ident
        self.children: dict = {}
        self.locks = 0
        self.alive = True


class RadixTree:
    """Cached prefixes of up to `capacity` blocks (plus what locks keep), `reserved` blocks held
    back for running requests."""

    def __init__(self, capacity: float):
        self.capacity = capacity
        self.reserved = 0
        self.size = 0                               # blocks held by the tree
        self._ids = itertools.count(1)
        self.root = Node((), None, 0, 0)
        self._clock = 0
        self._leaves: list = []                     # lazy heap of (stamp, id, node)

    def __len__(self) -> int:
        return self.size

    def _stamp(self, node: Node) -> None:
        node.stamp = self._clock
        if not node.children and node is not self.root:
            heapq.heappush(self._leaves, (node.stamp, node.id, node))

    def _split(self, node: Node, at: int) -> Node:
        """Cut `node` after its first `at` blocks: the head becomes a new parent (with the same
        locks, since every path through the tail runs through it)."""
        parent = node.parent
        assert parent is not None                   # a node the walk reached below the root
        head = Node(node.key[:at], parent, node.stamp, next(self._ids))
        head.locks = node.locks
        parent.children[head.key[0]] = head
        node.key = node.key[at:]
        node.parent = head
        head.children[node.key[0]] = node
        return head

    def _walk(self, keys: Sequence) -> tuple[int, Node]:
        """Match `keys` from the root, splitting where the match stops inside a node; stamp the path."""
        self._clock += 1
        node, matched, n = self.root, 0, len(keys)
        while matched < n:
            child = node.children.get(keys[matched])
            if child is None:
                break
            key = child.key
            common = 1
            limit = min(len(key), n - matched)
            while common < limit and key[common] == keys[matched + common]:
                common += 1
            if common < len(key):
                child = self._split(child, common)
            self._stamp(child)
            node, matched = child, matched + common
            if common < len(key):
                break
        return matched, node

    def match(self, keys: Sequence) -> int:
        """How many leading blocks of `keys` are cached (they become the most recently used)."""
        return self._walk(keys)[0]

    def match_node(self, keys: Sequence) -> tuple[int, Node]:
        """match(), and the node where the match ends (the root if none)."""
        return self._walk(keys)

    def insert(self, keys: Sequence, lock: bool = False) -> Node:
        """Cache the prefix `keys` and return its last node; with `lock`, that node is locked
        before evicting (so the new prefix survives its own insertion), and if the tree and the
        reservation still do not fit, the new tail is not kept (the tier never holds more than
        its capacity) and the prefix that was already there is locked instead."""
        matched, node = self._walk(keys)
        leaf = None
        if matched < len(keys):
            leaf = Node(tuple(keys[matched:]), node, self._clock, next(self._ids))
            node.children[leaf.key[0]] = leaf
            self.size += len(leaf.key)
            self._stamp(leaf)
        if not lock:
            self.evict()
            return leaf if leaf is not None and leaf.alive else node
        target = leaf or node
        self.lock(target)
        self.evict()
        if leaf is not None and self.size + self.reserved > self.capacity:
            self.unlock(leaf)
            self._remove(leaf)
            self.lock(node)
            return node
        return target

    def lock(self, node: Node) -> None:
        while node.parent is not None:              # up to the root, the one node without a parent
            node.locks += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node.parent is not None:              # up to the root
            node.locks -= 1
            if not node.locks and not node.children:
                heapq.heappush(self._leaves, (node.stamp, node.id, node))
            node = node.parent

    def reserve(self, blocks: int) -> None:
        self.reserved += blocks
        self.evict()

    def release(self, blocks: int) -> None:
        self.reserved -= blocks

    def evict(self) -> None:
        """Remove least recently used unlocked leaves until the tree and the reservation fit."""
        leaves = self._leaves
        while self.size + self.reserved > self.capacity and leaves:
            stamp, _, node = heapq.heappop(leaves)
            if not node.alive or node.children or node.stamp != stamp or node.locks:
                continue                            # stale entry, or locked (re-pushed on unlock)
            self._remove(node)

    def _remove(self, node: Node) -> None:
        """Drop the leaf `node`; its parent may become a leaf."""
        parent = node.parent
        assert parent is not None                   # a leaf: the root is never one (_stamp, unlock)
        del parent.children[node.key[0]]
        node.alive = False
        self.size -= len(node.key)
        if parent is not self.root and not parent.children:
            heapq.heappush(self._leaves, (parent.stamp, parent.id, parent))

    def nodes(self):
        """Every node but the root (for checks)."""
        todo = list(self.root.children.values())
        while todo:
            node = todo.pop()
            yield node
            todo.extend(node.children.values())
