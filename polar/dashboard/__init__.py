"""``polar dashboard``: a web UI over run directories (curves, resources, events, sessions, episodes, ratings).

It only reads run directories (and appends ratings to them); nothing but ``polar.cli`` imports it."""
