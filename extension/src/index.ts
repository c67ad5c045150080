/**
 * UVM Lab: wiring only. One left-sidebar panel that follows the current notebook's kernel.
 */

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';

import { uvmLabIcon } from './icon';
import { UvmLabModel } from './model';
import { UvmLabPanel } from './panel';

namespace CommandIDs {
  export const open = 'uvm-lab:open';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'uvm-lab:plugin',
  description: 'Live residency maps and controls for CUDA unified memory, in the left sidebar.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ILayoutRestorer, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null
  ) => {
    const model = new UvmLabModel();
    const panel = new UvmLabPanel(model);
    panel.id = 'uvm-lab';
    panel.title.icon = uvmLabIcon;
    panel.title.caption = 'UVM Lab';
    app.shell.add(panel, 'left', { rank: 900 });
    restorer?.add(panel, 'uvm-lab');

    // Follow whichever notebook is current; the model re-attaches on kernel change or restart.
    const follow = () => model.setSession(tracker.currentWidget?.sessionContext ?? null);
    tracker.currentChanged.connect(follow);
    follow();

    app.commands.addCommand(CommandIDs.open, {
      label: 'Open UVM Lab',
      caption: 'Show live unified-memory residency for the current notebook',
      icon: uvmLabIcon,
      execute: () => app.shell.activateById(panel.id)
    });
    palette?.addItem({ command: CommandIDs.open, category: 'UVM Lab' });
  }
};

export default plugin;
