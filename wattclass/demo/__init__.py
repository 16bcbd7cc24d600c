"""``wattclass demo``: the whole flow offline on a small cluster built from bundled recordings."""
