"""The reference pieces every compressor shares (no kernel of its own): see :mod:`.reference`."""
