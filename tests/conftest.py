pytest_plugins = ["scow.core.testing"]
