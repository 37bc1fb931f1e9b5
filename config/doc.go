// Package config owns dynwatch's configuration: the typed tree, its defaults, loading it from a
// YAML file with environment overrides (prefix DYNWATCH_), and validating it.
//
// Vocabulary: a Resource is one entry of `resources:`, naming a group/version and either a
// resource (plural, lower case) or a kind, resolved later through discovery. An Indexer adds a
// named cache index to a resource; a Transform strips fields before objects enter the cache.
//
// Everything is parsed at load time: selectors, JSONPaths, field paths and durations reach the
// rest of the service in parsed form, and Load reports every problem at once, each prefixed by
// its path in the file (`resources[1].indexers[0].path: ...`). A loaded Config is immutable and
// safe for concurrent use; JSONPath values serialise their own evaluation.
package config
