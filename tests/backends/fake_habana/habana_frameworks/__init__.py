"""Recording stand-in for Habana's ``habana_frameworks`` (tests only; see README.md)."""
