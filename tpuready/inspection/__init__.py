"""Looking inside a run: dispatched operators, host syncs and graph breaks, compilations, error
measures."""
