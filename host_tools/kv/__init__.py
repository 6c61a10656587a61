"""The KV block store on the host side: the modelled load time of a chunk and `pfcxl kv replay`
(a request trace through the real store by N host processes)."""
