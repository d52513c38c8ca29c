package reconciler

// RetainedMethods are the methods of the command records that retention
// (internal/retention) must never prune: the host-memory policy finds a
// node's latest episode from its records, numbered densely from 1
// (episodeOf), and an episode's victim records tell it which Workspaces it
// stopped already. They grow with memory-pressure episodes, not with
// commands.
func RetainedMethods() []string { return []string{hostMemoryMethod} }
