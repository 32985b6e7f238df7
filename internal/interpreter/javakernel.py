"""A Jupyter kernel for Java, for the code interpreter's language "java".

E2B's Java kernel is IJava, installed from GitHub (unreachable here), and
Debian packages no Jupyter kernel for Java. So this is one: the frame of
the JavaScript kernel (jskernel.py: ipykernel's Kernel class over one
child process, output relayed up to a marker) over one JVM running
JShell, the JDK's own REPL (JavaRunner.java, run from its source by
Java's launcher). The JVM starts at the first cell, as Node does there.

A cell goes to the JVM as its length in bytes on a line, then its bytes
(Java reads no JSON of its own); its outcome comes back as one JSON line.
"""

import os

from jskernel import HERE, JSKernel, main


class JavaKernel(JSKernel):
    implementation = "sandstorm-java"
    language = "java"
    language_version = "17"
    language_info = {"name": "java", "mimetype": "text/x-java-source", "file_extension": ".jshell"}
    banner = "Java (JShell)"
    program = "java"

    def child_argv(self, cells, outcomes):
        return [self.program,
                # One JVM per context: a small one, quick to start.
                "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
                "--add-modules", "jdk.jshell",
                os.path.join(HERE, "JavaRunner.java"), self.mark.decode(),
                "/proc/self/fd/%d" % cells, "/proc/self/fd/%d" % outcomes]

    def encode_cell(self, code):
        b = code.encode()
        return b"%d\n" % len(b) + b


if __name__ == "__main__":
    main(JavaKernel, {"java": JavaKernel.language_info})
