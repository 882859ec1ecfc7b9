"""The comparison report's script (drawn with the report's own charts)."""
