"""The config: every field as data, the schema and its checks, docs/config.md."""
