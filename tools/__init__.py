"""Programs around relpos that are not part of the library: running on an offline GPU host."""
