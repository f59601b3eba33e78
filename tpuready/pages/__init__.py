"""Markdown the book's pages show, rendered from the calculators' and the audit's facts."""
