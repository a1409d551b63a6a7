"""The store contract: what every store promises (:class:`~pitstop.Store`), its asyncio
twin, its options and URLs. The bottom layer of ``pitstop.store``: it imports no other
layer, so a reader learns what a store does here before how one does it."""
