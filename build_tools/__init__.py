"""tkaot's ahead-of-time build pipeline: sweep -> compile -> manifest -> wheel."""
