#!/usr/bin/env node
// The package's CLI. Sources are TypeScript run through tsx's loader, so `npm ci && npm start` needs no build step.
import { register } from 'tsx/esm/api';

register();
await import('../src/cli/main.ts');
