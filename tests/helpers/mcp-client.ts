/**
 * The SDK's Client for tests that read progress: the SDK (@modelcontextprotocol/client) handles a
 * response at once but a notification a microtask later, and a response drops its request's
 * progress handler. So when a progress notification and the response arrive in one read (stdio
 * under load: both lines in one chunk), the notification, though sent first, finds no handler and
 * is lost. This client hands responses on after the notifications already received (next
 * macrotask), so every notification sent before the response reaches `onprogress`.
 */
import { Client } from '@modelcontextprotocol/client';

export class OrderedClient extends Client {
  protected override _onresponse(response: Parameters<Client['_onresponse']>[0]): void {
    setImmediate(() => super._onresponse(response));
  }
}
