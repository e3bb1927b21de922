/** Transient messages in the corner of the page (loaded, link copied, worker restarted…). */
export interface Notice {
  id: number;
  kind: 'info' | 'warn' | 'error';
  text: string;
}

export class NoticeStore {
  list = $state<Notice[]>([]);

  /** show a notice; it goes away after `ms` (0: stays until dismissed) */
  notify(kind: Notice['kind'], text: string, ms = 8000): void {
    const id = Date.now() + Math.random();
    this.list.push({ id, kind, text });
    if (ms > 0) setTimeout(() => this.dismiss(id), ms);
  }

  dismiss(id: number): void {
    this.list = this.list.filter((n) => n.id !== id);
  }
}
