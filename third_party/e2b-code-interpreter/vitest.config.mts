// Not E2B's file: the code interpreter SDK's own vitest.config.mts (js/),
// without dotenv (the environment is given: E2B_API_KEY, E2B_DOMAIN,
// NODE_EXTRA_CA_CERTS point the tests here) and with test files run one
// at a time (each starts sandboxes with kernels: two cores shared with
// the rest of the machine). The tests are E2B's, unchanged.
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['tests/**/*.test.ts'],
    exclude: ['tests/runtimes/**'],
    fileParallelism: false,
    globals: false,
    testTimeout: 60_000,
    environment: 'node',
    bail: 0,
    server: {},
    deps: {
      interopDefault: true,
    },
    env: {
      ...(process.env as Record<string, string>),
    },
  },
})
