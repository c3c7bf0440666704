"""Backbones and their layers. Each module registers its entries (a backbone's builder `(cfg.model, data_spec) ->
nn.Module` exposes `.blocks` and `flops_per_sample()`); registry.load_entries finds them, so nothing here lists them."""
