/**
 * End-to-end tests of the built workbench in Debian's Chromium (never a downloaded browser),
 * one browser, one worker, no network: the page and a Hub stand-in are served on 127.0.0.1 by
 * the tests themselves (e2e/fixtures.ts). `npm run test:e2e` builds the page first.
 */
import { defineConfig } from '@playwright/test';

export const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--disable-quic',
  // exposes the SwiftShader WebGPU adapter (a software fallback) in headless Chromium
  '--enable-unsafe-webgpu',
];

export default defineConfig({
  testDir: 'e2e',
  testMatch: '*.spec.ts',
  timeout: 180_000,
  expect: { timeout: 30_000 },
  workers: 1,
  fullyParallel: false,
  retries: 0,
  forbidOnly: true,
  reporter: [['list']],
  outputDir: 'test-results',
  globalSetup: './e2e/global-setup.ts',
  use: {
    browserName: 'chromium',
    viewport: { width: 1280, height: 800 },
    launchOptions: { executablePath: process.env.LOUPE_CHROMIUM ?? '/usr/bin/chromium', args: CHROMIUM_ARGS },
    trace: 'off',
    screenshot: 'only-on-failure',
    actionTimeout: 30_000,
  },
});
