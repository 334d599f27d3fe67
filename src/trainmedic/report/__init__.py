"""Rendering findings and runs for people (terminal, HTML) and machines (JSON, trace)."""
