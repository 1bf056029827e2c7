/**
 * Work dispatch: jobs handed to consumers at least once, through a transport port (types.ts) with three
 * transports, in process, PostgreSQL (the store's own database) and Kafka. See README.md.
 */
export {
  DispatchClosed,
  DispatchLeaseLost,
  DispatchStopping,
  dispatchDefaults,
  type ConsumeOptions,
  type DispatchConsumer,
  type DispatchHandler,
  type DispatchMessage,
  type DispatchTimingOptions,
  type DispatchTransport,
} from './types.ts';
export { inProcessTransport, type InProcessDispatchOptions } from './in-process.ts';
export { postgresTransport, postgresDispatchDefaults, type PostgresDispatchOptions, type PostgresDispatchTransport } from './postgres.ts';
export { kafkaTransport, kafkaDispatchDefaults, type KafkaDispatchOptions, type KafkaDispatchTransport } from './kafka.ts';
