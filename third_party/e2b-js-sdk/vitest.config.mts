// Not E2B's file: the SDK's own vitest.config.mts, with only the projects
// that run against a server kept (its browser project needs Playwright's
// own Chromium build), its template tests a project of their own with
// the time a build takes, and a JSON report for test/e2e/e2bsdk_test.go to read. The tests are
// E2B's, unchanged; the environment (E2B_API_KEY, E2B_API_URL,
// E2B_SANDBOX_URL, E2B_DOMAIN, NODE_EXTRA_CA_CERTS) points them here.
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    projects: [
      {
        test: {
          name: 'unit',
          include: ['tests/**/*.test.ts'],
          exclude: [
            'tests/runtimes/**',
            'tests/template/**',
            'tests/connectionConfig.test.ts',
          ],
          isolate: true,
          globals: false,
          testTimeout: 30_000,
          environment: 'node',
          bail: 0,
          setupFiles: ['tests/globalFetchFallback.setup.ts'],
          server: {},
          deps: { interopDefault: true },
          env: { ...(process.env as Record<string, string>) },
        },
      },
      {
        test: {
          name: 'template',
          include: ['tests/template/**/*.test.ts'],
          isolate: true,
          globals: false,
          testTimeout: 300_000,
          environment: 'node',
          bail: 0,
          setupFiles: ['tests/globalFetchFallback.setup.ts'],
          server: {},
          deps: { interopDefault: true },
          env: { ...(process.env as Record<string, string>) },
        },
      },
      {
        test: {
          name: 'connectionConfig',
          include: ['tests/connectionConfig.test.ts'],
          globals: false,
          isolate: true,
          testTimeout: 10_000,
          environment: 'node',
        },
      },
    ],
  },
})
