package nodewire

// Node features, the names a node lists in Hello.features.
const (
	// FeatureNetwork: the node runs per-workspace networks that apply
	// DesiredWorkspace.network (policies, Egresses, Resolvers) and reports
	// ExecutionReport.network.
	FeatureNetwork = "network"
)

const (
	// DNSConfigVersion is the DNS configuration an execution started by
	// this release has (NetworkStatus.dns_config_version): /etc/resolv.conf
	// names the node's DNS server inside the workspace's subnet. 0 is an
	// execution an earlier release started.
	DNSConfigVersion = 1
	// MaxNetworkMessageBytes bounds NetworkStatus.message, why applying a
	// network configuration failed.
	MaxNetworkMessageBytes = 1024
)
