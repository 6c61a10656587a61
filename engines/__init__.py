"""pfcxl's KV block store (guest/python/pfcxl_kvstore.py, docs/kvstore.md) inside real serving
engines, through each engine's own plugin interface:

* `pfcxl.engines.lmcache`: `PfcxlStoragePlugin` (LMCache's StoragePluginInterface) and
  `PfcxlRemoteConnector` (its RemoteConnector), configured in LMCache's `extra_config`
  (`pfcxl.pool`, `pfcxl.host`, optional `pfcxl.base`);
* `pfcxl.engines.sglang`: `PfcxlHiCacheStorage` (SGLang's HiCacheStorage, a `dynamic` backend of
  its StorageBackendFactory; `pool`, `host`, optional `base` in its extra_config);
* `pfcxl.engines.vllm`: `PfcxlConnector` (vLLM's KVConnectorBase_V1, loaded by KVConnectorFactory
  through `kv_connector_module_path`; `pool`, `host`, optional `base` in kv_connector_extra_config).

The engines run in `<repo>/.venv-engines` (make engines), never in the main venv: this package
imports no engine; each module above imports its own, after checking its version (`require`).
"""
