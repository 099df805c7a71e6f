"""Which worker: where a prompt is prefilled (threshold or adaptive, priced by the cost model),
which worker of a tier takes it (least loaded, prefix-aware), and prefill workers lent to decode."""
