"""How the GPU tier and the KV tier behind it find, store and evict prefix blocks: the policy
both simulators (sim.py, trace_sim.py) share.

* chunk-lru (pfcxl's default): each tier is an LRU set of blocks; a lookup walks the prompt's
  blocks from the start, taking each from the GPU tier, else from the KV tier (which copies it
  into the GPU tier), and stops at the first block in neither. A prompt's blocks are written to
  both tiers (write-through).
* radix-lru (LLMServingSim, after SGLang): each tier is a radix tree (serving/radix.py). The GPU
  tree and the KV tree are matched from the start each on their own; blocks beyond the GPU's
  match that the KV tree holds are loaded (and enter the GPU tree). Write-through to both.
  With `reservation`, the KV tier first reserves room for the full KV (input and output) of
  every running request and locks the request's prefix until it finishes. With
  `reservation_scope = "session"` (our reading of LLMServingSim's reservation over every admitted
  request) a request's reservation and lock are held past its answer, until its session's next
  request arrives (or its session ends): every admitted session holds one.
* `store_answer` (LLMServingSim's cache_finished_req): a request that finishes stores the KV of
  its input and its output, so the next turn finds the answer too (the simulators call store()
  again with the longer prefix).

Hit accounting (what the reported "hit rate" counts): `any-tier` (pfcxl's): input tokens found
in any tier; `kv-beyond-gpu` (LLMServingSim's second-tier count): tokens the KV tier adds beyond
the GPU tier's hits.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfcxl.errors import ServingError

from pfcxl.serving.radix import RadixTree
from pfcxl.serving.tiers import LruTier

POLICIES = ("chunk-lru", "radix-lru")
ACCOUNTING = ("any-tier", "kv-beyond-gpu")
SCOPES = ("request", "session")


@dataclass(frozen=True)
class Policy:
    name: str = "chunk-lru"
    reservation: bool = False
    hit_accounting: str = "any-tier"
    store_answer: bool = False           # LLMServingSim: a finished request stores input + output KV
    reservation_scope: str = "request"   # session: held while the session is admitted (session model)

    def __post_init__(self) -> None:
        if self.reservation_scope not in SCOPES:
            raise ServingError(f"--reservation-scope: '{self.reservation_scope}' must be one of {', '.join(SCOPES)}")
        if self.reservation_scope != "request" and not self.reservation:
            raise ServingError("--reservation-scope sets what --reservation covers: use it with --reservation")
        if self.name not in POLICIES:
            raise ServingError(f"--policy: '{self.name}' must be one of {', '.join(POLICIES)}")
        if self.hit_accounting not in ACCOUNTING:
            raise ServingError(f"--hit-accounting: '{self.hit_accounting}' must be one of {', '.join(ACCOUNTING)}")
        if self.reservation and self.name != "radix-lru":
            raise ServingError("--reservation is radix-lru's (LLMServingSim's) mechanism: use it with "
                               "--policy radix-lru")

    @property
    def label(self) -> str:
        scope = f" per {self.reservation_scope}" if self.reservation_scope != "request" else ""
        return (f"{self.name}{', reservation' + scope if self.reservation else ''}"
                f"{', answers stored' if self.store_answer else ''}, hits {self.hit_accounting}")


@dataclass(frozen=True)
class Lookup:
    gpu: int        # blocks of the matched prefix taken from the GPU tier (free)
    kv: int         # blocks of it loaded from the KV tier
    counted: int    # blocks the hit accounting counts

    @property
    def hits(self) -> int:
        return self.gpu + self.kv


class TwoTiers:
    """The GPU tier (`gpu_blocks`; 0 = none) in front of the KV tier (`kv_blocks`). A request
    calls lookup() when it arrives, store() when its prefill is done and finish() when its
    answer is (the reservation's lifetime)."""

    def __init__(self, policy: Policy, gpu_blocks: float, kv_blocks: float):
        self.policy = policy
        # the tiers as the policy's kind: radix trees (radix-lru) or LRU block sets (the others)
        self._trees: tuple[RadixTree, RadixTree] | None = None
        self._sets: tuple[LruTier, LruTier] | None = None
        self.gpu: RadixTree | LruTier
        self.kv: RadixTree | LruTier
        if policy.name == "radix-lru":
            self.gpu, self.kv = self._trees = RadixTree(gpu_blocks), RadixTree(kv_blocks)
        else:
            self.gpu, self.kv = self._sets = LruTier("", gpu_blocks), LruTier("", kv_blocks)
        self._held: dict = {}                      # request -> (reserved blocks, locked KV-tier node)
        self._sessions: dict = {}                  # session -> its finished request still held

    def lookup(self, keys, request=None, blocks: int = 0, session=None) -> Lookup:
        """The longest cached prefix of `keys`; with reservation, `request` reserves `blocks`
        (per session: first releasing what the session's previous request still holds)."""
        if session in self._sessions:
            self._release(self._sessions.pop(session))
        if self._trees is not None:
            gpu, kv_tree = self._trees
            g = gpu.match(keys)
            s, node = kv_tree.match_node(keys)
            if self.policy.reservation:
                kv_tree.lock(node)                 # the running request's prefix stays
                self._held[request] = (blocks, node)
                kv_tree.reserve(blocks)
            if s > g:
                gpu.insert(keys[:s])
            found = Lookup(g, max(s - g, 0), 0)
        else:                                      # pfcxl's walk: each block from the first tier holding it
            gpu_set, kv_set = self._lru_sets()
            g = kv = 0
            for key in keys:
                if gpu_set.touch(key):
                    g += 1
                elif kv_set.touch(key):
                    gpu_set.put((key,))
                    kv += 1
                else:
                    break
            found = Lookup(g, kv, 0)
        counted = found.hits if self.policy.hit_accounting == "any-tier" else found.kv
        return Lookup(found.gpu, found.kv, counted)

    def _lru_sets(self) -> tuple[LruTier, LruTier]:
        assert self._sets is not None, "a policy's tiers are radix trees or LRU sets"
        return self._sets

    def store(self, keys, request=None) -> None:
        if self._trees is None:
            gpu_set, kv_set = self._lru_sets()
            gpu_set.put(keys)
            kv_set.put(keys)
            return
        gpu, kv_tree = self._trees
        gpu.insert(keys)
        if self.policy.reservation:
            blocks, old = self._held[request]
            self._held[request] = (blocks, kv_tree.insert(keys, lock=True))
            kv_tree.unlock(old)
        else:
            kv_tree.insert(keys)

    def finish(self, request, session=None, last: bool = True) -> None:
        """`request`'s answer is out. Its reservation ends now, or (reservation per session, and
        not the session's `last` request) when the session's next request arrives."""
        if self.policy.reservation_scope == "session" and session is not None and not last:
            self._sessions[session] = request
            return
        self._release(request)

    def _release(self, request) -> None:
        if self.policy.reservation and self._trees is not None:    # reservation is radix-lru's (Policy)
            kv_tree = self._trees[1]
            blocks, node = self._held.pop(request)
            kv_tree.release(blocks)
            kv_tree.unlock(node)
            kv_tree.evict()
