import type { GlobalPosition } from './types.ts';

export function comparePositions(a: GlobalPosition, b: GlobalPosition): number {
  return a.transactionId - b.transactionId || a.position - b.position;
}

export function formatPosition(p: GlobalPosition): string {
  return `${p.transactionId}/${p.position}`;
}
