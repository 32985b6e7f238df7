package gvisor

import specs "github.com/opencontainers/runtime-spec/specs-go"

// Mounts are the filesystems every sandbox's OCI spec mounts over its root:
// /proc, /dev and /sys as `runc spec` writes them by default (runsc fills
// /dev with its own devices), and /tmp as a tmpfs so that scratch files are
// memory, not the sandbox's volume. The node's bundles and this package's
// tests use the one list.
func Mounts() []specs.Mount {
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
	}
}

// Namespaces are the namespaces a sandbox gets: new PID, IPC, UTS and mount
// namespaces, and the network namespace at netnsPath that the node made
// for it (its veth and nothing else; runsc joins it rather than making
// one, so the boundary's listeners on the host side are its only way out).
func Namespaces(netnsPath string) []specs.LinuxNamespace {
	return []specs.LinuxNamespace{
		{Type: specs.PIDNamespace},
		{Type: specs.IPCNamespace},
		{Type: specs.UTSNamespace},
		{Type: specs.MountNamespace},
		{Type: specs.NetworkNamespace, Path: netnsPath},
	}
}
