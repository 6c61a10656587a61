"""vLLM 0.34.0 over pfcxl's KV block store: a KVConnectorBase_V1 that KVConnectorFactory loads
through `kv_connector_module_path`, one engine per host of one store.

    --kv-transfer-config '{"kv_connector": "PfcxlConnector", "kv_connector_module_path":
      "pfcxl.engines.vllm", "kv_role": "kv_both", "kv_connector_extra_config":
      {"pool": "/dev/dax0.0", "host": 0}}'       # optional "base": the store's first byte

One store block per vLLM KV block, under the block's hash (vLLM's own prefix hashing of the
request: `Request.block_hashes`): every layer's K and V of that block, in the layers' name order.

Scheduler side (the store opened read-only: the worker is the host's one writer):
`get_num_new_matched_tokens` counts the request's leading blocks that any host stored (never its
last token: vLLM computes at least one); `update_state_after_alloc` notes which of the request's
allocated blocks each loads into; `build_connector_meta` hands the worker the loads and, for new
requests, the full prompt blocks of this step that no host holds yet (stores).

Worker side, over the paged KV tensors vLLM registers (`register_kv_caches`, one tensor per
layer in the [2, num_blocks, block_size, heads, head_size] layout): `start_load_kv` copies every
load's block into its block id of every layer (synchronously: `wait_for_layer_load` has nothing
left to wait for); a block that no longer loads (evicted, torn, poisoned, of another key or
shape) is reported by `get_block_ids_with_load_errors`, so vLLM recomputes it, never wrong bytes.
`save_kv_layer` gathers each store's block from the layer, `wait_for_save` puts the blocks.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

from pfcxl.engines.common import leading, named, open_store, payload_of, require

require("vllm")

import torch  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
from vllm.logger import init_logger  # noqa: E402

logger = init_logger(__name__)

_HEAD = struct.Struct("<I")        # the length of the JSON header (layers, shape, dtype) after it


def block_key(block_hash: bytes) -> str:
    return "vllm/" + bytes(block_hash).hex()


@dataclass
class PfcxlConnectorMetadata(KVConnectorMetadata):
    loads: list[tuple[str, int]] = field(default_factory=list)    # (store key, block id)
    stores: list[tuple[str, int]] = field(default_factory=list)


class PfcxlConnector(KVConnectorBase_V1):
    """vLLM KV connector on one host of a pfcxl store."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.block_size = vllm_config.cache_config.block_size
        extra = self._kv_transfer_config.kv_connector_extra_config
        self.store = open_store(extra, "", "vLLM PfcxlConnector", writer=role == KVConnectorRole.WORKER)
        # scheduler side
        self._requests: dict[str, Any] = {}            # request id -> vLLM Request (its block hashes)
        self._computed: dict[str, int] = {}            # request id -> tokens vLLM had computed locally
        self._loads: dict[str, list[tuple[str, int]]] = {}
        # worker side
        self._kv: dict[str, torch.Tensor] = {}
        self._saving: dict[str, dict[str, torch.Tensor]] = {}
        self._load_errors: set[int] = set()

    # ------------------------------------------------------------ scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        self._requests[request.request_id] = request
        self._computed[request.request_id] = num_computed_tokens
        usable = (request.num_tokens - 1) // self.block_size
        hits = leading(self.store.exists(block_key(h)) for h in request.block_hashes[:usable])
        return max(hits * self.block_size - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if num_external_tokens <= 0:
            return
        block_ids = blocks.get_block_ids()[0]
        first = self._computed.get(request.request_id, 0) // self.block_size
        count = num_external_tokens // self.block_size
        self._loads[request.request_id] = [(block_key(request.block_hashes[i]), block_ids[i])
                                           for i in range(first, first + count)]

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = PfcxlConnectorMetadata()
        for new in scheduler_output.scheduled_new_reqs:
            loading = self._loads.pop(new.req_id, [])
            meta.loads += loading
            request = self._requests.get(new.req_id)
            if request is None:
                continue
            done = new.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
            full = min(done, len(new.prompt_token_ids or [])) // self.block_size
            loaded = {k for k, _ in loading}
            for i in range(min(full, len(request.block_hashes), len(new.block_ids[0]))):
                key = block_key(request.block_hashes[i])
                if key not in loaded and not self.store.exists(key):
                    meta.stores.append((key, new.block_ids[0][i]))
        self._loads.clear()
        return meta

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._requests.pop(request.request_id, None)
        self._computed.pop(request.request_id, None)
        return False, None

    # ------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._kv = dict(sorted(kv_caches.items()))

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, PfcxlConnectorMetadata)
        for key, block_id in meta.loads:
            layers = self._decode(payload_of(key, self.store.get(key)))
            if layers is None:
                self._load_errors.add(block_id)
                logger.warning("pfcxl: block %s no longer loads from the store: vLLM recomputes it", key)
                continue
            for name, tensor in zip(self._kv, layers, strict=True):
                self._kv[name][:, block_id].copy_(tensor)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """start_load_kv loaded every layer already."""

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, PfcxlConnectorMetadata)
        for key, block_id in meta.stores:
            self._saving.setdefault(key, {})[layer_name] = kv_layer[:, block_id].detach().to("cpu", copy=True)

    def wait_for_save(self) -> None:
        for key, layers in self._saving.items():
            if set(layers) == set(self._kv):
                self.store.put(key, named(key, self._encode([layers[n] for n in self._kv])))
            else:
                logger.warning("pfcxl: block %s was saved for %d of %d layers: not stored", key, len(layers),
                               len(self._kv))
        self._saving.clear()

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        self.store.close()

    # ------------------------------------------------------------ a block's bytes
    def _encode(self, layers: list[torch.Tensor]) -> bytes:
        head = json.dumps({"layers": list(self._kv), "shape": list(layers[0].shape),
                           "dtype": str(layers[0].dtype).removeprefix("torch.")}).encode()
        raw = b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in layers)
        return _HEAD.pack(len(head)) + head + raw

    def _decode(self, body) -> list[torch.Tensor] | None:
        """The block's layers as tensors shaped as our KV's blocks, or None: missing, or not of
        this engine's layers, shape and dtype."""
        if body is None:
            return None
        (n,) = _HEAD.unpack_from(body)
        head = json.loads(bytes(body[_HEAD.size:_HEAD.size + n]))
        first = next(iter(self._kv.values()))
        shape, dtype = list(first[:, 0].shape), first.dtype
        if head != {"layers": list(self._kv), "shape": shape, "dtype": str(dtype).removeprefix("torch.")}:
            return None
        data = torch.frombuffer(bytearray(body[_HEAD.size + n:]), dtype=torch.uint8)
        size = first[:, 0].numel() * first.element_size()
        if data.numel() != size * len(self._kv):
            return None
        return [data[i * size:(i + 1) * size].view(dtype).reshape(shape) for i in range(len(self._kv))]
