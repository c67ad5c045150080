/**
 * UVM Lab: wiring only. A left-sidebar panel (the compact view) and a main-area view, both
 * following the current notebook's kernel; a command that opens the view, from the palette, the
 * sidebar and `%uvm view` (which outputs a MIME bundle this extension renders by opening it).
 */

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { Widget } from '@lumino/widgets';

import { uvmLabIcon } from './icon';
import { UvmLabModel } from './model';
import { UvmLabPanel } from './panel';
import { UvmLabView } from './view';

namespace CommandIDs {
  export const open = 'uvm-lab:open';
  export const openView = 'uvm-lab:open-view';
}

/** What `%uvm view` outputs; rendering it opens the view (`uvm_lab.jupyter.magics.VIEW_MIME_TYPE`). */
const VIEW_MIME_TYPE = 'application/vnd.uvm-lab.view+json';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'uvm-lab:plugin',
  description: 'Live residency maps, a timeline and controls for CUDA unified memory.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ILayoutRestorer, ICommandPalette, IRenderMimeRegistry],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null,
    rendermime: IRenderMimeRegistry | null
  ) => {
    const model = new UvmLabModel();
    const panel = new UvmLabPanel(model, () => void app.commands.execute(CommandIDs.openView));
    panel.id = 'uvm-lab';
    panel.title.icon = uvmLabIcon;
    panel.title.caption = 'UVM Lab';
    app.shell.add(panel, 'left', { rank: 900 });
    restorer?.add(panel, 'uvm-lab');

    // Every model follows whichever notebook is current; each re-attaches on kernel change or restart.
    const models = new Set<UvmLabModel>([model]);
    const session = () => tracker.currentWidget?.sessionContext ?? null;
    tracker.currentChanged.connect(() => models.forEach(m => m.setSession(session())));
    model.setSession(session());

    const views = new WidgetTracker<MainAreaWidget<UvmLabView>>({ namespace: 'uvm-lab-view' });
    app.commands.addCommand(CommandIDs.openView, {
      label: 'Open the UVM Lab View',
      caption: 'Device lanes, timeline, page maps and controls for the current notebook, in the main area',
      icon: uvmLabIcon,
      execute: () => {
        const open = views.currentWidget;
        if (open && !open.isDisposed) {
          app.shell.activateById(open.id);
          return open;
        }
        const viewModel = new UvmLabModel();
        models.add(viewModel);
        viewModel.setSession(session());
        const content = new UvmLabView(viewModel);
        const widget = new MainAreaWidget({ content });
        widget.id = `uvm-lab-view-${++viewCount}`;
        widget.title.label = 'UVM Lab';
        widget.title.icon = uvmLabIcon;
        widget.title.closable = true;
        widget.disposed.connect(() => models.delete(viewModel));
        void views.add(widget);
        app.shell.add(widget, 'main', { mode: 'split-right' });
        app.shell.activateById(widget.id);
        return widget;
      }
    });
    restorer?.restore(views, { command: CommandIDs.openView, name: () => 'uvm-lab-view' });

    app.commands.addCommand(CommandIDs.open, {
      label: 'Open UVM Lab',
      caption: 'Show live unified-memory residency for the current notebook',
      icon: uvmLabIcon,
      execute: () => app.shell.activateById(panel.id)
    });
    palette?.addItem({ command: CommandIDs.open, category: 'UVM Lab' });
    palette?.addItem({ command: CommandIDs.openView, category: 'UVM Lab' });

    // `%uvm view`: a live output (trusted; a saved one reopened is not, and shows its text) opens the view.
    rendermime?.addFactory(
      {
        safe: false,
        mimeTypes: [VIEW_MIME_TYPE],
        createRenderer: () => new OpenViewRenderer(() => void app.commands.execute(CommandIDs.openView))
      },
      0
    );
  }
};

let viewCount = 0;

/** Renders `%uvm view`'s output: opens the view once, and leaves a line saying so. */
class OpenViewRenderer extends Widget {
  constructor(private readonly _open: () => void) {
    super();
    this.addClass('jp-UvmLab-openView');
  }

  renderModel(): Promise<void> {
    if (!this._opened) {
      this._opened = true;
      this._open();
    }
    this.node.textContent = 'The UVM Lab view is open in the main area.';
    return Promise.resolve();
  }

  private _opened = false;
}

export default plugin;
