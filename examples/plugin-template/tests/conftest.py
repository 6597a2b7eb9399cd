# Scow's fixtures (scow_broker, ...) and suites; redundant once scow registers its pytest
# plugin through the pytest11 entry point, harmless either way.
pytest_plugins = ["scow.core.testing"]
