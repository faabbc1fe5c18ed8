"""One module per benchmark scenario; each exposes `run(ctx) -> list[harness.Row]`."""
