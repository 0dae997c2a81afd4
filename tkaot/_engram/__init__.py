"""tkaot.engram's op modules and kernel declarations (the public names are in tkaot/engram.py)."""
