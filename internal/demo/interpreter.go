package demo

import (
	"slices"
	"strconv"

	"sandstorm/api"
)

// The code-interpreter demo is the template E2B's @e2b/code-interpreter
// SDK starts ("code-interpreter-v1" is its default name): base's Debian
// userland and user, with Python's ipykernel, numpy, pandas and
// matplotlib from Debian, and the code interpreter server
// (internal/interpreter, in sandstorm-envd, which the node mounts in
// every sandbox that runs envd) as its process, on port 49999. Its
// kernels run as root in /home/user, as E2B's do (its Jupyter server is
// root's; the SDK's own tests make contexts in /root); envd's commands
// run as "user", as in base.

// envdInSandbox is where a sandbox finds sandstorm-envd: the node mounts
// its directory at layout.EnvdMount (internal/node/layout; a test checks
// the two agree).
const envdInSandbox = "/.sandstorm/sandstorm-envd"

// interpreterLink is the process's executable: a symlink to envd, made
// in the rootfs, where a template's process must be (the mount is not in
// the rootfs; the link resolves inside the sandbox).
const interpreterLink = "/usr/local/bin/sandstorm-interpreter"

// interpreterPackages are what the code interpreter runs on: Python's
// kernel with the display formats' libraries, R's kernel, Node.js with
// TypeScript's compiler, and the JDK with JShell (the bash, JavaScript
// and Java kernels are the server's own, on ipykernel).
var interpreterPackages = []string{"python3-ipykernel", "python3-numpy", "python3-pandas", "python3-matplotlib",
	"r-base-core", "r-cran-irkernel", "nodejs", "node-typescript", "openjdk-17-jdk-headless"}

// interpreterCustomize builds matplotlib's font cache (root's, whose
// kernels draw) at build time: otherwise every sandbox's first chart
// would spend seconds on it.
var interpreterCustomize = []string{
	`chroot "$1" env HOME=/root /usr/bin/python3 -c "import matplotlib.font_manager"`,
}

var interpreterArgs = []string{interpreterLink, "interpreter",
	"--addr", ":" + strconv.Itoa(api.CodeInterpreterPort),
	"--workdir", "/home/user", "--python", "/usr/bin/python3"}

var interpreterDemo = demoSpec{
	packages: debianHost,
	debian: &debianSpec{
		include:   append(slices.Clone(basePackages), interpreterPackages...),
		customize: append(slices.Clone(baseCustomize), interpreterCustomize...),
	},
	args: interpreterArgs,
	env: []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"LANG=C.UTF-8",
	},
	envd: &api.Envd{User: "user", Workdir: "/home/user"},
	// Warm: the server answers /health once its default kernel answers,
	// so every sandbox is a restore of a running kernel. The reseed
	// draws new seeds for the kernels' random generators, which every
	// restore of one image would otherwise share.
	warm: &api.Warm{
		Probe:  api.Probe{Port: api.CodeInterpreterPort, Path: "/health"},
		Reseed: api.Reseed{Command: append(slices.Clone(interpreterArgs[:2]), "--reseed")},
		Pool:   1,
	},
	asRoot: true,
	files:  interpreterFiles,
}

// interpreterFiles are base's, and the link to envd.
func interpreterFiles(root string) ([]rootFile, error) {
	fs, err := baseFiles(root)
	return append(fs, rootFile{path: interpreterLink[1:], link: envdInSandbox}), err
}
