// The evaluator behind the Java kernel (javakernel.py): one JVM per
// context running JShell (the JDK's own REPL, jdk.jshell) with local
// execution, so snippets run in this JVM and what a cell declares is
// there for the next, as in jshell.
//
// Protocol (javakernel.py, the frame of jskernel.py): a cell is its
// length in bytes on a line, then its UTF-8 bytes, read from the file
// args[1] (the kernel's pipe); its output goes to stdout and stderr, then
// its outcome is one JSON line written to args[2] ({"mime": {...}} for
// the last snippet's value, {"error": {...}} for an exception or a
// snippet JShell rejects, {} for nothing), then the marker args[0] ends
// stdout and stderr. A SIGINT stops the cell running (JShell.stop).
//
// A value is shown as IJava (E2B's Java kernel) shows it: the text JShell
// gives for the last snippet when it is an expression (a String in
// quotes, which E2B's server takes off).
import java.io.BufferedInputStream;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.stream.Collectors;

import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.JShellException;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.VarSnippet;

public class JavaRunner {
    public static void main(String[] args) throws Exception {
        String mark = args[0];
        InputStream cells = new BufferedInputStream(new FileInputStream(args[1]));
        OutputStream outcomes = new FileOutputStream(args[2]);
        JShell shell = JShell.builder().executionEngine("local").out(System.out).err(System.err).build();
        // An interrupt stops the snippet running; the cell ends with it.
        sun.misc.Signal.handle(new sun.misc.Signal("INT"), sig -> shell.stop());
        while (true) {
            String code = readCell(cells);
            if (code == null) {
                System.exit(0);
            }
            String outcome;
            try {
                outcome = run(shell, code);
            } catch (RuntimeException e) {
                outcome = error(e.getClass().getSimpleName(), String.valueOf(e.getMessage()), List.of());
            }
            System.out.flush();
            System.err.flush();
            outcomes.write((outcome + "\n").getBytes(StandardCharsets.UTF_8));
            outcomes.flush();
            System.out.print(mark + "0\n");
            System.out.flush();
            System.err.print(mark + "0\n");
            System.err.flush();
        }
    }

    // readCell is the next cell, or null at the end of the pipe.
    static String readCell(InputStream in) throws IOException {
        StringBuilder n = new StringBuilder();
        for (int c = in.read(); c != '\n'; c = in.read()) {
            if (c < 0) {
                return null;
            }
            n.append((char) c);
        }
        byte[] b = in.readNBytes(Integer.parseInt(n.toString().trim()));
        return new String(b, StandardCharsets.UTF_8);
    }

    // run evaluates code snippet by snippet (JShell takes one at a time),
    // stopping at the first that fails.
    static String run(JShell shell, String code) {
        SourceCodeAnalysis sca = shell.sourceCodeAnalysis();
        String rest = code;
        String value = null;
        while (!rest.isBlank()) {
            SourceCodeAnalysis.CompletionInfo ci = sca.analyzeCompletion(rest);
            if (!ci.completeness().isComplete()) {
                return error("CompilationException", "incomplete input: " + rest.strip(), List.of());
            }
            rest = ci.remaining();
            value = null;
            for (SnippetEvent e : shell.eval(ci.source())) {
                if (e.causeSnippet() != null) {
                    continue; // a dependent snippet updated, not this one
                }
                if (e.exception() != null) {
                    return thrown(e.exception());
                }
                if (e.status() == Snippet.Status.REJECTED) {
                    String why = shell.diagnostics(e.snippet())
                            .map(d -> d.getMessage(Locale.ROOT)).collect(Collectors.joining("\n"));
                    return error("CompilationException", why, List.of(ci.source().strip()));
                }
                if (isExpression(e.snippet())) {
                    value = e.value();
                }
            }
        }
        if (value == null) {
            return "{}";
        }
        return "{\"mime\": {\"text/plain\": " + json(value) + "}}";
    }

    // isExpression: an expression's snippet, which JShell keeps as a
    // variable of its own ($1...) when it has a value.
    static boolean isExpression(Snippet s) {
        return s.kind() == Snippet.Kind.EXPRESSION
                || (s instanceof VarSnippet && s.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND);
    }

    static String thrown(JShellException e) {
        String name = e instanceof EvalException ee ? ee.getExceptionClassName() : e.getClass().getName();
        List<String> trace = new ArrayList<>();
        trace.add(name + ": " + e.getMessage());
        for (StackTraceElement f : e.getStackTrace()) {
            trace.add("\tat " + f);
        }
        return error(name.substring(name.lastIndexOf('.') + 1), String.valueOf(e.getMessage()), trace);
    }

    static String error(String name, String value, List<String> trace) {
        return "{\"error\": {\"ename\": " + json(name) + ", \"evalue\": " + json(value) + ", \"traceback\": ["
                + trace.stream().map(JavaRunner::json).collect(Collectors.joining(", ")) + "]}}";
    }

    // json is s as a JSON string.
    static String json(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                default -> {
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
            }
        }
        return b.append('"').toString();
    }
}
