"""The suite's options: declared once, parsed, checked before any work, tabulated for the docs, and applied per
command."""
